//go:build unix

package idemserver_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/internal/crashtest"
)

func init() { crashChildren["pause"] = childPause }

// pauseLease is the lease of the paused server: shorter than its pause.
const pauseLease = time.Second

// childPause serves POST /orders (key required) on loopback from a
// BoltStore with a one-second lease. Its handler announces each run and
// waits until POST /release (outside the middleware) lets it answer.
func childPause() int {
	s, err := idemserver.OpenBoltStore(os.Getenv("IDEM_STORE"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer s.Close()
	mw := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithLease(pauseLease))
	release := make(chan struct{})
	var runs atomic.Int32
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		crashtest.Emit("running", strconv.Itoa(int(n)))
		select {
		case <-release:
		case <-r.Context().Done():
			crashtest.Emit("cancelled", strconv.Itoa(int(n)), context.Cause(r.Context()).Error())
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order of run %d", n)
	})))
	mux.HandleFunc("POST /release", func(w http.ResponseWriter, r *http.Request) { close(release) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	crashtest.Emit("listening", ln.Addr().String(), strconv.Itoa(os.Getpid()))
	return func() int {
		err := http.Serve(ln, mux)
		fmt.Fprintln(os.Stderr, err)
		return 1
	}()
}

// TestBoltStorePausedPastLeaseRunsHandlerOnce: a server on BoltStore
// with a one-second lease is stopped (SIGSTOP) for 2.5 s while a handler
// runs, as a GC pause, a VM migration or a throttled cgroup stops a
// process; a second request with the same key arrives meanwhile and waits
// in the kernel. When the process goes on (SIGCONT), the second request
// is answered 409, the handler's own request gets its answer, and the
// handler ran once: the key's holder is a live goroutine of this process,
// which an in-process store knows, whatever the clock says.
func TestBoltStorePausedPastLeaseRunsHandlerOnce(t *testing.T) {
	child := crashtest.Start(t, "pause", "IDEM_STORE="+filepath.Join(t.TempDir(), "keys.db"))
	line, ok := child.Next()
	require.True(t, ok, "the child ended before listening")
	f := strings.Fields(line)
	require.Len(t, f, 3, "listening line %q", line)
	base := "http://" + f[1]
	pid, err := strconv.Atoi(f[2])
	require.NoError(t, err)

	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
	type answer struct {
		status int
		body   string
		err    error
	}
	order := func(out chan<- answer) {
		r, err := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(`{"amount":1}`))
		if err != nil {
			out <- answer{err: err}
			return
		}
		r.Header.Set("Idempotency-Key", "order-1")
		resp, err := hc.Do(r)
		if err != nil {
			out <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- answer{status: resp.StatusCode, body: string(b), err: err}
	}
	first, second := make(chan answer, 1), make(chan answer, 1)
	go order(first)
	line, _ = child.Next()
	require.Equal(t, "running 1", line)

	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	go order(second)               // accepted by the kernel, read once the process goes on
	time.Sleep(pauseLease * 5 / 2) // 2.5 s: the lease lapses while the process stands still
	require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))

	var a2 answer
	got2 := false
	select {
	case a2 = <-second:
		got2 = true
	case <-time.After(10 * time.Second): // a bound for the failure only: a second run waits for /release
	}
	released, err := hc.Post(base+"/release", "text/plain", nil)
	require.NoError(t, err)
	released.Body.Close()
	if !got2 {
		a2 = <-second
	}
	a1 := <-first

	third := make(chan answer, 1)
	go order(third)
	a3 := <-third
	lines := child.Kill()

	require.NoError(t, a2.err)
	assert.Equal(t, http.StatusConflict, a2.status, "the second request, sent while the process stood still: %s", a2.body)
	require.NoError(t, a1.err)
	assert.Equal(t, http.StatusCreated, a1.status, "the running handler's own request: %s", a1.body)
	require.NoError(t, a3.err)
	assert.Equal(t, http.StatusCreated, a3.status)
	assert.Equal(t, a1.body, a3.body, "a retry after the answer gets it replayed")
	runs := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "running ") {
			runs++
		}
	}
	assert.Equal(t, 1, runs, "the handler ran once; the child said %q", lines)
}
