// Package crashstate records what a child process does to its files with
// strace and builds every state a crash could leave those files in, at
// every persistence point: the crash-state harness of the bbolt journal
// (the root package) and of idemserver's BoltStore.
//
// strace runs with --seccomp-bpf, so that only the traced calls stop the
// child (the Go runtime's futexes do not).
//
// Why strace and not a FUSE layer: strace (a Debian package; ptrace, no
// root, no mount, no new module dependency) sees the real system calls of
// the real code, in one total order across the child's threads: every
// pwrite64 with its offset and bytes, fsync and fdatasync, ftruncate,
// openat with O_CREAT, renameat, unlinkat, and every write on a TCP
// socket. With -xx -yy each buffer and each descriptor's path comes out
// in hexadecimal, so the trace is parsed exactly, and a trace is a file:
// the same trace always gives the same crash states, which is what makes
// a failure reproducible (its seed and crash point name it). The states
// themselves are built offline from the trace, so thousands are checked
// per recording without rerunning the child. A FUSE layer would instead
// have to be mounted (root or fusermount), would add
// github.com/hanwen/go-fuse to a module, and would sit between bbolt's
// memory map and the page cache, which changes what bbolt reads.
//
// The file-system model is POSIX's, not ext4's, and so it allows more
// states than ext4 would (ALICE's "abstract persistence model"):
//   - a write or truncate is durable once an fsync or fdatasync of its
//     file returned 0 after it; until then a crash may keep it, drop it,
//     or keep part of it, in whole 512-byte sectors (a sector is written
//     whole or not at all: the disk's atomic unit);
//   - the unsynced writes of a file may be kept in any subset: each state
//     keeps all, none, each one alone, or all with the last torn;
//   - a name made (file created, renamed) or removed in a directory is
//     durable once that directory was fsynced after it; until then a
//     crash may keep any prefix of the directory's changes, in order.
//
// A write that returned -1 (strace's fault injection, or a real EIO or
// ENOSPC) transferred nothing, as Linux's write(2) says: one that wrote
// part of its bytes returns their count instead, and only those bytes are
// kept or dropped like any unsynced write. An fsync that failed made
// nothing durable: the writes before it stay unsynced.
package crashstate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Kind is what an Op is.
type Kind int

// The kinds of Op.
const (
	Write    Kind = iota + 1 // pwrite64 or write to a file: Path, Off, Data
	Truncate                 // ftruncate: Path, Size
	Sync                     // fsync or fdatasync of a file: Path
	DirSync                  // fsync of a directory: Path
	Create                   // openat with O_CREAT of a file that did not exist: Path
	Rename                   // renameat: From, Path
	Unlink                   // unlinkat: Path
	Link                     // linkat: From, Path (a second name of From's file)
	Send                     // write on a TCP socket: Data, Sock
	Mark                     // write to the child's standard output (crashtest.Emit): Data
)

// String returns the kind's name ("write", "dirsync", ...), "?" for the
// zero Kind, or "Kind(n)" for a value no constant names.
func (k Kind) String() string {
	names := [...]string{"?", "write", "truncate", "sync", "dirsync", "create", "rename", "unlink", "link", "send", "mark"}
	if k < 0 || int(k) >= len(names) {
		return "Kind(" + strconv.Itoa(int(k)) + ")"
	}
	return names[k]
}

// Op is one system call of the trace, in the order the calls returned.
type Op struct {
	Seq   int // index in the trace's ops
	Kind  Kind
	Path  string // the file (or directory) it applies to; for Rename, the new name
	From  string // Rename: the old name
	Off   int64  // Write: the offset (-1 for a write at the file's offset)
	Data  []byte // Write, Send, Mark: the bytes
	Size  int64  // Truncate: the new size
	Sock  string // Send: the socket, as strace names it ("TCP:[a->b]")
	Errno string // "" if the call succeeded, else its errno ("EIO")
	// Injected says the error was strace's fault injection.
	Injected bool
}

// String returns the op as one line of a listing: its index, kind, file
// and what the kind carries.
func (o Op) String() string {
	s := fmt.Sprintf("#%d %s %s", o.Seq, o.Kind, filepath.Base(o.Path))
	switch o.Kind {
	case Write:
		s += fmt.Sprintf(" off=%d len=%d", o.Off, len(o.Data))
	case Truncate:
		s += fmt.Sprintf(" size=%d", o.Size)
	case Rename, Link:
		s = fmt.Sprintf("#%d %s %s -> %s", o.Seq, o.Kind, filepath.Base(o.From), filepath.Base(o.Path))
	case Send, Mark:
		d := o.Data
		if len(d) > 40 {
			d = d[:40]
		}
		s = fmt.Sprintf("#%d %s %q", o.Seq, o.Kind, d)
	}
	if o.Errno != "" {
		s += " = " + o.Errno
	}
	return s
}

// Need skips t with one line when strace is missing, and fails it instead
// when CI=true. It returns strace's path.
func Need(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("strace")
	if err == nil {
		// ptrace may be forbidden (a container without CAP_SYS_PTRACE).
		if out, err := exec.Command(p, "-qq", "-e", "trace=none", "true").CombinedOutput(); err != nil {
			err = fmt.Errorf("strace cannot trace here: %v: %s", err, bytes.TrimSpace(out))
			p = ""
			if os.Getenv("CI") == "true" {
				t.Fatalf("%v (CI=true: the crash-state harness must run)", err)
			}
			t.Skipf("skipped: %v", err)
		}
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("strace is not installed (apt-get install strace); CI=true: the crash-state harness must run")
	}
	t.Skip("skipped: strace is not installed (apt-get install strace), which the crash-state harness needs")
	return ""
}

// Run runs the test binary as a child in the crashtest helper mode mode
// (see internal/crashtest) under strace, with the extra environment env,
// and returns the file operations under root (and every socket write and
// standard-output write), the lines the child emitted, and the child's
// error if it did not exit with status 0. inject, if not empty, are
// strace -e inject= expressions ("fdatasync:error=EIO:when=3").
func Run(t testing.TB, root, mode string, inject []string, env ...string) ([]Op, []string, error) {
	t.Helper()
	strace := Need(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tf, err := os.CreateTemp("", "crashstate-*.trace")
	if err != nil {
		t.Fatal(err)
	}
	tf.Close()
	defer os.Remove(tf.Name())
	args := []string{"-f", "--seccomp-bpf", "-qq", "-o", tf.Name(), "-s", "67108864", "-xx", "-yy", "-e", "signal=none",
		"-e", "trace=openat,pwrite64,write,fsync,fdatasync,ftruncate,renameat,renameat2,rename,linkat,unlinkat,sendto"}
	for _, in := range inject {
		args = append(args, "-e", "inject="+in)
	}
	args = append(args, exe, "-test.run=^$", "-test.count=1", "-test.v=false", "-test.timeout=10m")
	cmd := exec.Command(strace, args...)
	// A race-enabled child would sleep a second at exit (the race
	// detector's atexit_sleep_ms): the harness runs many children.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(append(os.Environ(), "IDEM_CRASHTEST_MODE="+mode, "GORACE="+gorace), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	if runErr != nil {
		runErr = fmt.Errorf("child %s: %w: %s", mode, runErr, lastLines(stderr.String(), 20))
	}
	var lines []string
	for _, l := range strings.Split(stdout.String(), "\n") {
		if rest, ok := strings.CutPrefix(l, "@crashtest "); ok {
			lines = append(lines, rest)
		}
	}
	raw, err := os.ReadFile(tf.Name())
	if err != nil {
		t.Fatal(err)
	}
	ops, err := Parse(raw, root)
	if err != nil {
		t.Fatalf("parse the trace of %s: %v", mode, err)
	}
	return ops, lines, runErr
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// Parse reads an strace output made with -f -xx -yy and returns the
// operations on files under root, every socket write and every write to
// standard output, in the order the calls returned.
func Parse(raw []byte, root string) ([]Op, error) {
	root = filepath.Clean(root)
	under := func(p string) bool { return p == root || strings.HasPrefix(p, root+"/") }
	pending := map[string]string{} // pid -> the unfinished call's text
	exists := map[string]bool{}    // files under root known to exist
	var ops []Op
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	for sc.Scan() {
		line := sc.Text()
		pid, text, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		text = strings.TrimLeft(text, " ")
		if strings.HasPrefix(text, "<... ") {
			i := strings.Index(text, " resumed>")
			if i < 0 {
				return nil, fmt.Errorf("bad resumed line %.200q", line)
			}
			text = pending[pid] + text[i+len(" resumed>"):]
			delete(pending, pid)
		} else if t, ok := strings.CutSuffix(text, " <unfinished ...>"); ok {
			pending[pid] = t
			continue
		}
		if strings.HasPrefix(text, "+++") || strings.HasPrefix(text, "---") || strings.Contains(text, "<detached ...>") {
			continue
		}
		op, keep, err := parseCall(text)
		if err != nil {
			return nil, fmt.Errorf("%w in %.300q", err, line)
		}
		if !keep {
			continue
		}
		switch op.Kind {
		case Send, Mark:
		case Create:
			if !under(op.Path) {
				continue
			}
			if exists[op.Path] && op.Size < 0 {
				continue // opened, not created
			}
			if exists[op.Path] { // O_TRUNC of an existing file
				op.Kind, op.Size = Truncate, 0
			} else {
				op.Size = 0
			}
			exists[op.Path] = true
		case Rename:
			if !under(op.Path) && !under(op.From) {
				continue
			}
			if op.Errno == "" {
				delete(exists, op.From)
				exists[op.Path] = true
			}
		case Link:
			if !under(op.Path) {
				continue
			}
			if op.Errno == "" {
				exists[op.Path] = true
			}
		case Unlink:
			if !under(op.Path) {
				continue
			}
			if op.Errno == "" {
				if !exists[op.Path] {
					continue // a directory or a file never seen
				}
				delete(exists, op.Path)
			}
		case Sync:
			if !under(op.Path) {
				continue
			}
			if !exists[op.Path] {
				op.Kind = DirSync
			}
		default:
			if !under(op.Path) {
				continue
			}
		}
		op.Seq = len(ops)
		ops = append(ops, op)
	}
	return ops, sc.Err()
}

// parseCall parses "name(args) = ret ..." and says whether it is kept.
func parseCall(text string) (Op, bool, error) {
	var op Op
	open := strings.IndexByte(text, '(')
	// strace pads the return value to a column: ")     = 22".
	eq := strings.LastIndex(text, " = ")
	end := -1
	if eq > 0 {
		end = len(strings.TrimRight(text[:eq], " ")) - 1
		if end < 0 || text[end] != ')' {
			end = -1
		}
	}
	if open < 0 || end < open {
		if strings.Contains(text, ") = ?") || strings.HasSuffix(text, "= ?") {
			return op, false, nil // the process exited inside the call
		}
		return op, false, errors.New("unparsed call")
	}
	name := text[:open]
	args := splitArgs(text[open+1 : end])
	ret := text[eq+3:]
	retVal, retRest, _ := strings.Cut(ret, " ")
	if strings.HasPrefix(retVal, "-1") {
		f := strings.Fields(retRest)
		if len(f) > 0 {
			op.Errno = f[0]
		}
		op.Injected = strings.Contains(ret, "(INJECTED)")
	}
	fdPath := func(a string) (path string, sock string) {
		i := strings.IndexByte(a, '<')
		if i < 0 || !strings.HasSuffix(a, ">") {
			return "", ""
		}
		s := a[i+1 : len(a)-1]
		if strings.HasPrefix(s, "TCP:") || strings.HasPrefix(s, "TCPv6:") {
			return "", s
		}
		return unhex(s), ""
	}
	switch name {
	case "pwrite64", "write", "sendto":
		if len(args) < 3 {
			return op, false, errors.New("short write")
		}
		p, sock := fdPath(args[0])
		op.Data = unquote(args[1])
		if op.Errno == "" {
			if n, err := strconv.Atoi(retVal); err == nil && n < len(op.Data) {
				op.Data = op.Data[:n] // a short write
			}
		}
		switch {
		case sock != "":
			op.Kind, op.Sock = Send, sock
			return op, op.Errno == "", nil
		case strings.HasPrefix(args[0], "1<"):
			op.Kind = Mark
			return op, op.Errno == "", nil
		case p == "" || name == "sendto":
			return op, false, nil
		}
		op.Kind, op.Path, op.Off = Write, p, -1
		if name == "pwrite64" {
			off, err := strconv.ParseInt(args[3], 10, 64)
			if err != nil {
				return op, false, err
			}
			op.Off = off
		}
		return op, true, nil
	case "fsync", "fdatasync":
		p, _ := fdPath(args[0])
		op.Kind, op.Path = Sync, p
		return op, p != "", nil
	case "ftruncate":
		p, _ := fdPath(args[0])
		n, err := strconv.ParseInt(args[1], 10, 64)
		op.Kind, op.Path, op.Size = Truncate, p, n
		return op, p != "", err
	case "openat":
		if len(args) < 3 || !strings.Contains(args[2], "O_CREAT") || op.Errno != "" {
			return op, false, nil
		}
		p, _ := fdPath(retVal)
		op.Kind, op.Path, op.Size = Create, p, -1
		if strings.Contains(args[2], "O_TRUNC") {
			op.Size = 0
		}
		return op, p != "", nil
	case "renameat", "renameat2", "rename":
		op.Kind = Rename
		if name == "rename" {
			op.From, op.Path = abs("", string(unquote(args[0]))), abs("", string(unquote(args[1])))
		} else {
			d1, _ := fdPath(args[0])
			d2, _ := fdPath(args[2])
			op.From, op.Path = abs(d1, string(unquote(args[1]))), abs(d2, string(unquote(args[3])))
		}
		return op, true, nil
	case "linkat":
		d1, _ := fdPath(args[0])
		d2, _ := fdPath(args[2])
		op.Kind, op.From, op.Path = Link, abs(d1, string(unquote(args[1]))), abs(d2, string(unquote(args[3])))
		return op, true, nil
	case "unlinkat":
		d, _ := fdPath(args[0])
		op.Kind, op.Path = Unlink, abs(d, string(unquote(args[1])))
		return op, !strings.Contains(strings.Join(args, ","), "AT_REMOVEDIR"), nil
	}
	return op, false, nil
}

func abs(dir, p string) string {
	if filepath.IsAbs(p) || dir == "" {
		return filepath.Clean(p)
	}
	return filepath.Join(dir, p)
}

// splitArgs splits strace's argument list at its top-level commas.
func splitArgs(s string) []string {
	var out []string
	depth, start, inQ := 0, 0, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' && (i == 0 || s[i-1] != '\\'):
			inQ = !inQ
		case inQ:
		case c == '(' || c == '[' || c == '{' || c == '<':
			depth++
		case c == '>' && i > 0 && s[i-1] == '-': // a socket's "a->b"
		case c == ')' || c == ']' || c == '}' || c == '>':
			depth--
		case c == ',' && depth == 0:
			out = append(out, strings.TrimSpace(s[start:i]))
			start = i + 1
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

// unquote decodes a -xx string argument ("\x41\x42", perhaps with a
// trailing "..." strace adds to a cut string, which -s prevents).
func unquote(a string) []byte {
	a = strings.TrimSuffix(a, "...")
	a = strings.TrimSuffix(strings.TrimPrefix(a, "\""), "\"")
	return []byte(unhex(a))
}

// unhex decodes \xHH escapes; other bytes are kept.
func unhex(s string) string {
	if !strings.Contains(s, `\x`) {
		return s
	}
	b := make([]byte, 0, len(s)/4)
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] == 'x' {
			if v, err := strconv.ParseUint(s[i+2:i+4], 16, 8); err == nil {
				b = append(b, byte(v))
				i += 3
				continue
			}
		}
		b = append(b, s[i])
	}
	return string(b)
}

// TempDir returns a new directory for a recording or for crash states,
// removed when t ends: on /dev/shm (tmpfs) where there is one, so that
// the fsyncs of the child and of the checks cost nothing (the crash states
// are the harness's model, not the disk's), else t.TempDir().
func TempDir(t testing.TB) string {
	t.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "crashstate-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// Report fails t with each of failures, the first ten in full and a count
// of the rest, so that a harness run that breaks everywhere stays
// readable.
func Report(t testing.TB, failures []string) {
	t.Helper()
	for i, f := range failures {
		if i == 10 {
			t.Errorf("... and %d more", len(failures)-10)
			return
		}
		t.Error(f)
	}
}
