// Package crashtest runs a helper child process and kills it for real, so a
// test can check what survives a crash.
//
// The child is the test binary itself, re-executed with an environment
// variable naming a helper mode. The test binary's TestMain looks the mode
// up before any test runs and, in a child, runs that mode's function
// instead of the tests:
//
//	var children = map[string]func() int{"reserve": childReserve}
//
//	func TestMain(m *testing.M) {
//		if child, ok := children[crashtest.Mode()]; ok {
//			os.Exit(child())
//		}
//		os.Exit(m.Run())
//	}
//
//	func childReserve() int {
//		for ... {
//			// do durable work, then announce it:
//			crashtest.Emit("reserved", key)
//		}
//		return 0
//	}
//
//	func TestCrash(t *testing.T) {
//		c := crashtest.Start(t, "reserve", "JOURNAL="+path)
//		lines := c.KillAfter(rand.IntN(200) + 1) // SIGKILL after that many lines
//		// reopen the journal and check every line's effect is there
//	}
//
// Only lines written with Emit reach the parent, so the test framework's own
// output does not get in the way. Emit writes each line with one write system
// call to an unbuffered stdout: once Emit returned, the line reaches the
// parent even if the child is killed the next instant.
package crashtest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// EnvMode is the environment variable that holds the child's helper mode.
const EnvMode = "IDEM_CRASHTEST_MODE"

// prefix marks the lines Emit writes.
const prefix = "@crashtest "

// Mode returns the helper mode this process was started in, or "" in a
// normal test run.
func Mode() string { return os.Getenv(EnvMode) }

// Emit writes one line, the fields separated by spaces, to the parent. A
// field must not contain a newline. Emit is for the child; it is safe for
// concurrent use.
func Emit(fields ...string) {
	line := prefix + strings.Join(fields, " ") + "\n"
	if _, err := os.Stdout.WriteString(line); err != nil {
		// The parent is gone; nobody is listening.
		os.Exit(3)
	}
}

// Child is a running helper process.
type Child struct {
	t     testing.TB
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{} // closed when stdout reached EOF
	seen  []string
	ended bool
}

// Start runs the test binary as a child in helper mode mode, with the
// extra environment variables env ("NAME=value"). The binary's TestMain
// must run the mode (see the package documentation); should it not, the
// child runs no test and exits without a line. The child is killed when
// the test ends, if it still runs. Its standard error goes to the test's
// log on failure.
func Start(t testing.TB, mode string, env ...string) *Child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("crashtest: %v", err)
	}
	// -test.run=^$ matches no test: a mode that TestMain does not run
	// must not run the tests, which would start children of their own.
	cmd := exec.Command(exe, "-test.run=^$", "-test.count=1", "-test.v=false", "-test.timeout=5m")
	cmd.Env = append(append(os.Environ(), EnvMode+"="+mode), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("crashtest: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("crashtest: start %s: %v", exe, err)
	}
	c := &Child{t: t, cmd: cmd, lines: make(chan string, 1024), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), prefix); ok {
				c.lines <- line
			}
		}
	}()
	t.Cleanup(func() {
		if !c.ended {
			c.Kill()
		}
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("crashtest: child stderr:\n%s", stderr.String())
		}
	})
	return c
}

// Next waits for the child's next line and returns it, or returns false if
// the child ended its output (exited or was killed) first.
func (c *Child) Next() (string, bool) {
	line, ok := <-c.lines
	if ok {
		c.seen = append(c.seen, line)
	}
	return line, ok
}

// KillAfter waits until the child has emitted n lines (or ended), then
// kills it with SIGKILL and returns every line it emitted, including any
// that arrived between the n-th line and the kill.
func (c *Child) KillAfter(n int) []string {
	for len(c.seen) < n {
		if _, ok := c.Next(); !ok {
			break
		}
	}
	return c.Kill()
}

// KillWhen waits until the child emits a line for which match returns true
// (or ends), then kills it with SIGKILL and returns every line it emitted.
func (c *Child) KillWhen(match func(line string) bool) []string {
	for {
		line, ok := c.Next()
		if !ok || match(line) {
			break
		}
	}
	return c.Kill()
}

// Kill kills the child with SIGKILL, waits for it, and returns every line
// it emitted. Calling it on a child that already exited only collects its
// remaining lines.
func (c *Child) Kill() []string {
	c.t.Helper()
	if c.ended {
		return c.seen
	}
	c.ended = true
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		c.t.Errorf("crashtest: kill: %v", err)
	}
	for {
		if _, ok := c.Next(); !ok {
			break
		}
	}
	<-c.done
	err := c.cmd.Wait()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		c.t.Errorf("crashtest: wait: %v", err)
	}
	return c.seen
}

// Wait waits for the child to exit on its own and returns its lines and an
// error if it did not exit with status 0.
func (c *Child) Wait() ([]string, error) {
	c.ended = true
	for {
		if _, ok := c.Next(); !ok {
			break
		}
	}
	<-c.done
	if err := c.cmd.Wait(); err != nil {
		return c.seen, fmt.Errorf("crashtest: child: %w", err)
	}
	return c.seen, nil
}
