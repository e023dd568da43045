// Package readmetest checks that the Go blocks of the repository's
// README.md compile as written.
//
// A block that starts with a package clause is built as the file it is. Any
// other block is a fragment: its import declarations are hoisted, and the
// rest is either top-level declarations (when it starts with a func or type
// declaration) or the body of
//
//	func snippet(ctx context.Context) error { ...; return nil }
//
// in a file that also imports context, errors, fmt, io, log, net/http, os,
// strings, time and idem. A fragment must declare every other name it uses,
// so that a reader can copy it into such a function. Blocks that import
// openai-go, anthropic-sdk-go or stripe-go are built in the sdktest module
// (outside the workspace, Go 1.26+); the others in this module, with the
// workspace's modules (otel, pgstore) at hand.
package readmetest

import (
	"bufio"
	"fmt"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// block is one ```go block of the README.
type block struct {
	line int // of its first line of code, from 1
	code string
}

// goBlocks returns the ```go blocks of the markdown file at path.
func goBlocks(t *testing.T, path string) []block {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out  []block
		cur  *strings.Builder
		from int
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur, from = &strings.Builder{}, n+1
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, block{line: from, code: cur.String()})
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// defaultImports are the packages a fragment may use without importing
// them, with a name of each to keep the import used.
var defaultImports = [][2]string{
	{"context", "context.Background"}, {"errors", "errors.Is"}, {"fmt", "fmt.Sprint"}, {"io", "io.EOF"},
	{"log", "log.Print"}, {"net/http", "http.MethodPost"}, {"os", "os.Getenv"}, {"strings", "strings.NewReader"},
	{"time", "time.Second"}, {"github.com/idemgo/idem", "idem.New"},
}

// source returns the Go file a block builds as.
func source(b block) string {
	if isFile(b.code) {
		return b.code
	}
	imports, body := hoistImports(strings.Split(b.code, "\n"))
	own := map[string]bool{}
	for _, imp := range imports {
		if m := importSpec.FindStringSubmatch(imp); m != nil {
			own[m[1]] = true
		}
	}
	var s strings.Builder
	s.WriteString("package main\n\nimport (\n")
	for _, imp := range imports {
		fmt.Fprintf(&s, "\t%s\n", imp)
	}
	var uses []string
	for _, d := range defaultImports {
		if !own[d[0]] {
			fmt.Fprintf(&s, "\t%q\n", d[0])
			uses = append(uses, d[1])
		}
	}
	s.WriteString(")\n\n")
	for _, u := range uses {
		fmt.Fprintf(&s, "var _ = %s\n", u)
	}
	// The line directives make the compiler's errors name README.md's lines.
	if declarations(body) {
		fmt.Fprintf(&s, "\nfunc main() {}\n\n//line README.md:%d\n%s\n", b.line, strings.Join(body, "\n"))
		return s.String()
	}
	fmt.Fprintf(&s, "\nfunc main() { _ = snippet(context.Background()) }\n\n")
	fmt.Fprintf(&s, "func snippet(ctx context.Context) error {\n//line README.md:%d\n%s\n\treturn nil\n}\n", b.line, strings.Join(body, "\n"))
	return s.String()
}

var (
	importLine = regexp.MustCompile(`^import\s+((?:[A-Za-z_][A-Za-z0-9_]*\s+)?"[^"]+")\s*(//.*)?$`)
	importSpec = regexp.MustCompile(`^(?:[A-Za-z_][A-Za-z0-9_]*\s+)?"([^"]+)"`)
)

// hoistImports splits a fragment's leading import declarations (single
// lines, or a parenthesized block) from the rest, and drops the blank
// lines between.
func hoistImports(lines []string) (imports, body []string) {
	i := 0
	for ; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		switch {
		case line == "":
			continue
		case line == "import (":
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != ")"; i++ {
				if spec := strings.TrimSpace(lines[i]); spec != "" && !strings.HasPrefix(spec, "//") {
					imports = append(imports, spec)
				}
			}
			continue
		}
		if m := importLine.FindStringSubmatch(line); m != nil {
			imports = append(imports, m[1])
			continue
		}
		break
	}
	return imports, lines[i:]
}

// declarations reports whether a fragment's body is top-level
// declarations (its first line of code declares a func or type) rather
// than statements.
func declarations(body []string) bool {
	for _, line := range body {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		return strings.HasPrefix(line, "func ") || strings.HasPrefix(line, "type ")
	}
	return false
}

// isFile reports whether code starts with a package clause, after
// comments.
func isFile(code string) bool {
	for _, line := range strings.Split(code, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "//"):
			continue
		case strings.HasPrefix(line, "package "):
			return true
		}
		return false
	}
	return false
}

// needsSDKs reports whether code imports an SDK only the sdktest module
// requires.
func needsSDKs(code string) bool {
	for _, p := range []string{"github.com/openai/", "github.com/anthropics/", "github.com/stripe/"} {
		if strings.Contains(code, `"`+p) {
			return true
		}
	}
	return false
}

// vet writes each block as a package of its own under dir and runs go vet
// on them there, with env added.
func vet(t *testing.T, dir string, blocks []block, env ...string) {
	t.Helper()
	if len(blocks) == 0 {
		return
	}
	root, err := os.MkdirTemp(dir, "_readme-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	args := []string{"vet"}
	for _, b := range blocks {
		d := filepath.Join(root, fmt.Sprintf("line%d", b.line))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		name := "main.go"
		if err := os.WriteFile(filepath.Join(d, name), []byte(source(b)), 0o644); err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(dir, d)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "./"+filepath.ToSlash(rel))
	}
	cmd := exec.Command(goTool(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("README.md Go blocks do not build (go %s in %s): %v\n%s", strings.Join(args, " "), dir, err, out)
	}
}

func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		p = filepath.Join(build.Default.GOROOT, "bin", "go")
		if _, err := os.Stat(p); err != nil {
			t.Skip("no go command to build the README's blocks with")
		}
	}
	return p
}

func TestREADMEGoBlocksBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the README's Go blocks with the go command")
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlocks(t, filepath.Join(repo, "README.md"))
	if len(blocks) == 0 {
		t.Fatal("no Go blocks in README.md")
	}
	var here, sdk []block
	for _, b := range blocks {
		if needsSDKs(b.code) {
			sdk = append(sdk, b)
		} else {
			here = append(here, b)
		}
	}
	t.Run("workspace", func(t *testing.T) {
		vet(t, filepath.Join(repo, "internal", "readmetest"), here)
	})
	t.Run("sdktest", func(t *testing.T) {
		if len(sdk) == 0 {
			t.Skip("no block uses an SDK")
		}
		out, err := exec.Command(goTool(t), "env", "GOVERSION").Output()
		if err != nil {
			t.Fatal(err)
		}
		if v := strings.TrimSpace(string(out)); v < "go1.26" && !strings.HasPrefix(v, "go1.3") {
			t.Skipf("%d README block(s) use SDKs that need Go 1.26 (sdktest); this is %s", len(sdk), v)
		}
		vet(t, filepath.Join(repo, "sdktest"), sdk, "GOWORK=off")
	})
}
