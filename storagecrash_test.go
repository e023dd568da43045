package idem_test

// The crash-state harness of the client journal (internal/crashstate):
// a child records, under strace, ACE-style workloads against a loopback
// server of its own; every state a crash could leave the journal's
// directory in, at every persistence point, is opened with the real code
// and checked against what had left on the socket and what the caller
// had been told. See storagecrash_oracle_test.go for the oracle.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/boltfile"
	"github.com/idemgo/idem/internal/crashstate"
	"github.com/idemgo/idem/internal/crashtest"
)

var (
	soak     = flag.Duration("soak", 0, "run the crash-state harness over random workloads for this long (go test -run TestCrashStatesSoak -soak=30m)")
	soakSeed = flag.Uint64("soak.seed", 0, "the first seed of -soak (0: from the clock)")
)

func init() {
	crashChildren["crashstate-client"] = childCrashStateClient
}

// Workload steps, one letter each.
const (
	stepPost    = 'P' // a keyed POST of a new named operation
	stepRedrive = 'D' // the last operation again, by name, same payload
	stepResume  = 'R' // Resume
	stepExpire  = 'X' // expire the last operation still pending (as idem expire does)
	stepSweep   = 'S' // Sweep every finished operation
	stepReopen  = 'C' // Close, then Open again, compacting the file
	stepSteps   = "PDRXSC"
)

// aceWorkloads returns every sequence of 1 to n steps.
func aceWorkloads(n int) []string {
	out := []string{""}
	var all []string
	for i := 0; i < n; i++ {
		var next []string
		for _, w := range out {
			for _, s := range stepSteps {
				next = append(next, w+string(s))
			}
		}
		all = append(all, next...)
		out = next
	}
	return all
}

// randomWorkload returns a longer workload for seed.
func randomWorkload(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		if r.IntN(3) == 0 {
			b[i] = stepPost
		} else {
			b[i] = stepSteps[r.IntN(len(stepSteps))]
		}
	}
	return string(b)
}

// The child's loopback server: every third new key's first attempt is
// performed and its answer lost (the connection is closed), so that the
// workloads have operations in doubt for Resume and expire.
type crashServer struct {
	mu     sync.Mutex
	seen   map[string]int
	nth    int
	answer map[string][]byte
}

func (s *crashServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.seen[key]++
	first := s.seen[key] == 1
	if first {
		s.nth++
		s.answer[key] = append([]byte("done "), body...)
	}
	lose := first && s.nth%3 == 0
	ans := s.answer[key]
	s.mu.Unlock()
	if lose {
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				c.Close()
				return
			}
		}
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(ans)
}

// childCrashStateClient runs the workloads of CRASHSTATE_WORKLOADS (comma
// separated), each in a directory of its own under CRASHSTATE_ROOT, one
// after the other, all journal calls on one locked OS thread (so that
// strace's per-thread fault counts fall on the journal's own calls).
func childCrashStateClient() int {
	runtime.LockOSThread()
	root := os.Getenv("CRASHSTATE_ROOT")
	srv := &crashServer{seen: map[string]int{}, answer: map[string][]byte{}}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	for i, w := range strings.Split(os.Getenv("CRASHSTATE_WORKLOADS"), ",") {
		dir := filepath.Join(root, fmt.Sprintf("w%03d", i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			crashtest.Emit("fatal", err.Error())
			return 1
		}
		crashtest.Emit("begin", strconv.Itoa(i), w)
		runClientWorkload(i, w, dir, ts.URL)
		crashtest.Emit("end", strconv.Itoa(i))
	}
	return 0
}

// clientOpts are the options of every client of the harness: one attempt,
// so that a lost answer leaves its operation pending, and no sweep or
// resume of its own.
func clientOpts() []idem.Option {
	return []idem.Option{idem.WithMaxAttempts(1), idem.WithRetention(1000 * time.Hour), idem.WithResendWindow(999 * time.Hour)}
}

func openClient(path string) (*idem.Client, *idem.BoltStore, error) {
	s, err := idem.OpenBoltStore(path, &idem.BoltOptions{ScrubDelay: -1})
	if err != nil {
		return nil, nil, err
	}
	return idem.New(s, clientOpts()...), s, nil
}

func emitErr(step int, what string, err error) {
	var ie *idem.Error
	key, cause := "-", "-"
	if errors.As(err, &ie) {
		if ie.Key != "" {
			key = ie.Key
		}
		if ie.Cause != nil {
			cause = ie.Cause.Error()
		}
	}
	kind := "other"
	switch {
	case errors.Is(err, idem.ErrOutcomeUnknown):
		kind = "unknown"
	case errors.Is(err, idem.ErrJournalWrite):
		kind = "notsent"
	case errors.Is(err, idem.ErrJournalCorrupt):
		kind = "corrupt"
	case errors.Is(err, idem.ErrAttemptsExhausted):
		kind = "exhausted"
	}
	crashtest.Emit("err", strconv.Itoa(step), what, kind, key, strings.ReplaceAll(cause, " ", "_"), strings.ReplaceAll(err.Error(), " ", "_"))
}

func runClientWorkload(wi int, w, dir, url string) {
	path := filepath.Join(dir, "journal.db")
	c, s, err := openClient(path)
	if err != nil {
		emitErr(-1, "open", err)
		return
	}
	defer func() {
		if c != nil {
			if err := c.Close(); err != nil {
				emitErr(len(w), "close", err)
			}
		}
	}()
	ctx := context.Background()
	ops := 0
	last := ""
	post := func(i int, name string) {
		body := fmt.Sprintf(`{"w":%d,"op":%q}`, wi, name)
		req, _ := http.NewRequestWithContext(idem.WithOperation(ctx, name), http.MethodPost, url+"/pay", strings.NewReader(body))
		resp, err := c.HTTPClient().Do(req)
		if err != nil {
			emitErr(i, "post:"+name, err)
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		key := resp.Request.Header.Get("Idempotency-Key")
		crashtest.Emit("done", strconv.Itoa(i), name, key, strconv.Itoa(resp.StatusCode), strconv.Quote(string(b)))
	}
	for i, step := range w {
		crashtest.Emit("step", strconv.Itoa(i), string(step))
		switch step {
		case stepPost:
			ops++
			last = fmt.Sprintf("op%d", ops)
			post(i, last)
		case stepRedrive:
			if last == "" {
				ops++
				last = fmt.Sprintf("op%d", ops)
			}
			post(i, last)
		case stepResume:
			err := c.Resume(ctx, func(op idem.Operation, resp *http.Response, err error) {
				if resp != nil {
					resp.Body.Close()
					crashtest.Emit("resumed", strconv.Itoa(i), op.Name, op.Key, strconv.Itoa(resp.StatusCode))
				}
			})
			if err != nil {
				emitErr(i, "resume", err)
			}
		case stepExpire:
			pend, err := s.Pending(ctx, "", 100)
			if err != nil {
				emitErr(i, "expire", err)
				continue
			}
			if len(pend) > 0 {
				op := pend[len(pend)-1]
				err := s.Finish(ctx, op.Key, idem.Outcome{State: idem.StateExpired, Status: op.LastStatus, Err: "expired by the harness", URL: op.URL, At: time.Now(), Owner: op.Owner})
				if err != nil {
					emitErr(i, "expire", err)
				} else {
					crashtest.Emit("expiring", strconv.Itoa(i), op.Name, op.Key)
				}
			}
		case stepSweep:
			crashtest.Emit("sweeping", strconv.Itoa(i))
			if _, err := s.Sweep(ctx, time.Now().Add(time.Hour)); err != nil {
				emitErr(i, "sweep", err)
			}
		case stepReopen:
			if err := c.Close(); err != nil {
				emitErr(i, "close", err)
			}
			c = nil
			// Compact the workload's small file, as Open does a large
			// mostly free one.
			minSize, ratio := boltfile.CompactMinSize, boltfile.CompactFreeRatio
			boltfile.CompactMinSize, boltfile.CompactFreeRatio = 0, 0
			c, s, err = openClient(path)
			boltfile.CompactMinSize, boltfile.CompactFreeRatio = minSize, ratio
			if err != nil {
				c = nil
				emitErr(i, "open", err)
				return
			}
			crashtest.Emit("reopened", strconv.Itoa(i))
		}
	}
}

// recordClient records workloads under strace and returns the ops and
// lines.
func recordClient(t *testing.T, workloads []string, inject ...string) (string, []crashstate.Op, []string) {
	t.Helper()
	root := crashstate.TempDir(t)
	ops, lines, err := crashstate.Run(t, root, "crashstate-client", inject,
		"CRASHSTATE_ROOT="+root, "CRASHSTATE_WORKLOADS="+strings.Join(workloads, ","))
	if err != nil {
		t.Fatalf("%v\nlines: %q", err, lines)
	}
	return root, ops, lines
}

// loopback returns a server whose handler is h, for the checks.
func loopback(t testing.TB, h http.Handler) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return "http://" + l.Addr().String()
}
