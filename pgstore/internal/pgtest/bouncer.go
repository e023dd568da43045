package pgtest

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Bouncer starts a PgBouncer of t's own in front of the server at dsn — in
// transaction pooling mode, listening on 127.0.0.1 only, on a free port —
// and returns dsn through it (same user, password and database). It stops
// when t ends. Without the pgbouncer command (Debian's package installs
// /usr/sbin/pgbouncer; .ci/run installs it) it skips t with a one-line
// reason, or fails t when CI=true.
func Bouncer(t testing.TB, dsn string) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr == nil {
			bin, err = "/usr/sbin/pgbouncer", nil
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("pgbouncer is not installed and CI=true: the PgBouncer tests are required in CI (.ci/run installs it)")
		}
		t.Skip("no pgbouncer: apt-get install -y pgbouncer to run this test")
	}
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		t.Fatalf("pgtest: PgBouncer needs a URL with a user and password, not %q", dsn)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		host, port = u.Host, "5432"
	}
	user := u.User.Username()
	password, _ := u.User.Password()

	// pgbouncer refuses to run as root: as root it runs as postgres,
	// which must read its files.
	dir, err := os.MkdirTemp("", "idem-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	listen := freePort(t)
	conf := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = plain
auth_file = %s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits
server_reset_query =
`, host, port, listen, filepath.Join(dir, "userlist.txt"))
	files := map[string]string{
		"pgbouncer.ini": conf,
		"userlist.txt":  strconv.Quote(user) + " " + strconv.Quote(password) + "\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres"}, args...)
	}
	cmd := exec.Command(bin, args...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("pgtest: start pgbouncer: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT) // a clean shutdown
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(listen))
	for start := time.Now(); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("pgtest: pgbouncer exited: %v: %s", err, out.String())
		default:
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("pgtest: pgbouncer does not listen on %s: %s", addr, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	u.Host = addr
	return u.String()
}

// freePort returns a TCP port on 127.0.0.1 that nothing listened on a
// moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// syncBuffer is a bytes.Buffer safe for a child's output and a test's read.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
