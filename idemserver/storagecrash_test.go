package idemserver_test

// The crash-state harness of the server store (internal/crashstate): a
// child records, under strace, ACE-style workloads of keyed requests to a
// loopback server behind the middleware and a BoltStore; every state a
// crash could leave the store's directory in, at every persistence point,
// is opened with the real code and checked: every answer that left on the
// socket is replayed byte-identical, and its handler never runs again.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/internal/boltfile"
	"github.com/idemgo/idem/internal/crashstate"
	"github.com/idemgo/idem/internal/crashtest"
)

func init() { crashChildren["crashstate-server"] = childCrashStateServer }

// Server workload steps.
const (
	srvNew    = 'N' // a request with a new key
	srvAgain  = 'A' // the last key again, same payload (a retry)
	srvSweep  = 'S' // Sweep everything stored
	srvReopen = 'C' // close the store, open it again, compacting it
	srvSteps  = "NASC"
)

func srvWorkloads(n int) []string {
	out, all := []string{""}, []string(nil)
	for i := 0; i < n; i++ {
		var next []string
		for _, w := range out {
			for _, s := range srvSteps {
				next = append(next, w+string(s))
			}
		}
		all, out = append(all, next...), next
	}
	return all
}

// srvHandler is the application: it announces each run on standard
// output (a write in the trace), then answers with the key and the run's
// number in this process.
type srvHandler struct{ runs atomic.Int64 }

func (h *srvHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The connection's goroutine, which commits the store's records after
	// the handler, stays on one thread (strace counts faults per thread);
	// the thread ends with the connection.
	runtime.LockOSThread()
	key := r.Header.Get("Idempotency-Key")
	n := h.runs.Add(1)
	crashtest.Emit("ran", key, strconv.FormatInt(n, 10))
	w.Header().Set("X-Run", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "answer %s %d", key, n)
}

func childCrashStateServer() int {
	runtime.LockOSThread()
	root := os.Getenv("CRASHSTATE_ROOT")
	for i, w := range strings.Split(os.Getenv("CRASHSTATE_WORKLOADS"), ",") {
		dir := filepath.Join(root, fmt.Sprintf("w%03d", i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return 1
		}
		crashtest.Emit("begin", strconv.Itoa(i), w)
		runServerWorkload(i, w, filepath.Join(dir, "keys.db"))
		crashtest.Emit("end", strconv.Itoa(i))
	}
	return 0
}

func runServerWorkload(wi int, w, path string) {
	h := &srvHandler{}
	var store *idemserver.BoltStore
	var srv *httptest.Server
	open := func() bool {
		var err error
		store, err = idemserver.OpenBoltStore(path, nil)
		if err != nil {
			crashtest.Emit("err", "open", strings.ReplaceAll(err.Error(), " ", "_"))
			return false
		}
		mw := idemserver.New(store, idemserver.WithSweepInterval(-1), idemserver.WithSingleTenant())
		srv = httptest.NewServer(mw.Required(h))
		return true
	}
	shut := func() {
		srv.Close()
		if err := store.Close(); err != nil {
			crashtest.Emit("err", "close", strings.ReplaceAll(err.Error(), " ", "_"))
		}
	}
	if !open() {
		return
	}
	keys := 0
	post := func(i int) {
		key := fmt.Sprintf("w%d-k%d", wi, keys)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(fmt.Sprintf(`{"order":%q}`, key)))
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			crashtest.Emit("err", strconv.Itoa(i), key, strings.ReplaceAll(err.Error(), " ", "_"))
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		crashtest.Emit("got", strconv.Itoa(i), key, strconv.Itoa(resp.StatusCode), strconv.Quote(string(b)))
	}
	for i, step := range w {
		crashtest.Emit("step", strconv.Itoa(i), string(step))
		switch step {
		case srvNew:
			keys++
			post(i)
		case srvAgain:
			if keys == 0 {
				keys++
			}
			post(i)
		case srvSweep:
			crashtest.Emit("sweeping", strconv.Itoa(i))
			if _, err := store.Sweep(context.Background(), time.Now().Add(1000*time.Hour)); err != nil {
				crashtest.Emit("err", strconv.Itoa(i), "sweep", strings.ReplaceAll(err.Error(), " ", "_"))
			}
		case srvReopen:
			shut()
			minSize, ratio := boltfile.CompactMinSize, boltfile.CompactFreeRatio
			boltfile.CompactMinSize, boltfile.CompactFreeRatio = 0, 0
			ok := open()
			boltfile.CompactMinSize, boltfile.CompactFreeRatio = minSize, ratio
			if !ok {
				return
			}
			crashtest.Emit("reopened", strconv.Itoa(i))
		}
	}
	shut()
}

var answerRE = regexp.MustCompile(`answer (\S+) (\d+)$`)

// srvAnswer is an answer that left on the socket.
type srvAnswer struct {
	key, body string
}

// parseAnswer returns the stored-able answer a server's socket write
// carries (a 201 of the handler), if any.
func parseAnswer(b []byte) (srvAnswer, bool) {
	if !bytes.HasPrefix(b, []byte("HTTP/1.1 201 ")) {
		return srvAnswer{}, false
	}
	_, body, _ := bytes.Cut(b, []byte("\r\n\r\n"))
	m := answerRE.FindSubmatch(body)
	if m == nil {
		return srvAnswer{}, false
	}
	return srvAnswer{key: string(m[1]), body: string(body)}, true
}

type srvWorkload struct {
	index int
	steps string
	root  string
	ops   []crashstate.Op
}

func splitSrv(root string, ops []crashstate.Op) []srvWorkload {
	var out []srvWorkload
	for _, op := range ops {
		if op.Kind == crashstate.Mark {
			f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(string(op.Data)), "@crashtest "))
			if len(f) >= 2 && f[0] == "begin" {
				i, _ := strconv.Atoi(f[1])
				steps := ""
				if len(f) > 2 {
					steps = f[2]
				}
				out = append(out, srvWorkload{index: i, steps: steps, root: filepath.Join(root, fmt.Sprintf("w%03d", i))})
				continue
			}
		}
		if len(out) > 0 {
			cur := &out[len(out)-1]
			op.Seq = len(cur.ops)
			cur.ops = append(cur.ops, op)
		}
	}
	return out
}

// srvChecker checks crash states of server workloads.
type srvChecker struct {
	dir            string
	states, unique int
	refused        int
	cache          map[string]error
}

func (c *srvChecker) check(w srvWorkload) (int, error) {
	return crashstate.States(w.root, w.ops, crashstate.Options{MaxTorn: 8}, func(st crashstate.State) error {
		c.states++
		if err := c.checkState(w, st); err != nil {
			return fmt.Errorf("workload %d %q, crash after %s, state %q: %w", w.index, w.steps, w.ops[st.Point], st.Why, err)
		}
		return nil
	})
}

func (c *srvChecker) checkState(w srvWorkload, st crashstate.State) error {
	answered := map[string]string{}
	swept := map[string]string{} // answered before a sweep: forgotten, as retention says, even if replayed while the sweep commits
	for _, op := range w.ops[:st.Point+1] {
		switch op.Kind {
		case crashstate.Send:
			if a, ok := parseAnswer(op.Data); ok && swept[a.key] != a.body {
				answered[a.key] = a.body
			}
		case crashstate.Mark:
			if f := strings.Fields(string(op.Data)); len(f) >= 2 && f[1] == "sweeping" {
				for k, b := range answered {
					swept[k] = b
				}
				answered = map[string]string{}
			}
		}
	}
	h := st.Hash()
	ck := fmt.Sprintf("%x|%v", h, answered)
	if err, ok := c.cache[ck]; ok {
		return err
	}
	c.unique++
	err := c.checkOpen(st, answered)
	c.cache[ck] = err
	return err
}

func (c *srvChecker) checkOpen(st crashstate.State, answered map[string]string) (err error) {
	if err := st.Materialize(c.dir); err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	s, err := idemserver.OpenBoltStore(filepath.Join(c.dir, "keys.db"), nil)
	if err != nil {
		if !errors.Is(err, idem.ErrJournalCorrupt) {
			return fmt.Errorf("Open: untyped error %v", err)
		}
		if len(answered) > 0 {
			return fmt.Errorf("Open refused the store after %d answers were sent: %v", len(answered), err)
		}
		c.refused++
		return nil
	}
	defer s.Close()
	mw := idemserver.New(s, idemserver.WithSweepInterval(-1), idemserver.WithSingleTenant())
	defer mw.Close()
	ran := 0
	h := mw.Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran++
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "answer again")
	}))
	for key, body := range answered {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(fmt.Sprintf(`{"order":%q}`, key)))
		r.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if ran > 0 {
			return fmt.Errorf("key %s: its answer %q was sent before the crash, and its handler ran again", key, body)
		}
		if rec.Code != http.StatusCreated || rec.Body.String() != body {
			return fmt.Errorf("key %s: replay %d %q, want the answer sent before the crash, %q", key, rec.Code, rec.Body.String(), body)
		}
	}
	return nil
}

// TestCrashStatesServerStore is the CI subset: every server workload of
// up to three steps, every persistence point, every crash state of each.
func TestCrashStatesServerStore(t *testing.T) {
	crashstate.Need(t)
	ws := srvWorkloads(3)
	root := crashstate.TempDir(t)
	ops, lines, err := crashstate.Run(t, root, "crashstate-server", nil, "CRASHSTATE_ROOT="+root, "CRASHSTATE_WORKLOADS="+strings.Join(ws, ","))
	if err != nil {
		t.Fatalf("%v\n%q", err, lines)
	}
	c := &srvChecker{dir: crashstate.TempDir(t), cache: map[string]error{}}
	points := 0
	var failures []string
	for _, w := range splitSrv(root, ops) {
		p, err := c.check(w)
		points += p
		if err != nil {
			failures = append(failures, err.Error())
		}
	}
	t.Logf("%d workloads, %d persistence points, %d crash states checked (%d distinct), %d refused before any answer was sent", len(ws), points, c.states, c.unique, c.refused)
	crashstate.Report(t, failures)
}

// TestServerStoreFailedFdatasync: the Nth fdatasync (then pwrite64) of
// the server store fails with EIO or ENOSPC while a client sends new keys
// and retries. After a failed fsync or an I/O error no handler runs again
// and no answer is sent that was not stored before it, until the store
// is reopened; and every crash state of the run replays every answer
// sent.
func TestServerStoreFailedFdatasync(t *testing.T) {
	crashstate.Need(t)
	c := &srvChecker{dir: crashstate.TempDir(t), cache: map[string]error{}}
	fired := 0
	const w = "NANCNAN"
	// Each fdatasync and pwrite64 of the store in a clean run.
	count := map[string]int{}
	{
		root := crashstate.TempDir(t)
		ops, lines, err := crashstate.Run(t, root, "crashstate-server", nil, "CRASHSTATE_ROOT="+root, "CRASHSTATE_WORKLOADS="+w)
		if err != nil {
			t.Fatalf("%v\n%q", err, lines)
		}
		for _, op := range ops {
			if strings.HasPrefix(filepath.Base(op.Path), "keys.db") {
				switch op.Kind {
				case crashstate.Sync:
					count["fdatasync"]++
				case crashstate.Write:
					count["pwrite64"]++
				}
			}
		}
	}
	for _, sc := range []string{"fdatasync", "pwrite64"} {
		for _, errno := range []string{"EIO", "ENOSPC"} {
			for n := 1; n <= count[sc]; n++ {
				inject := fmt.Sprintf("%s:error=%s:when=%d", sc, errno, n)
				root := crashstate.TempDir(t)
				ops, lines, err := crashstate.Run(t, root, "crashstate-server", []string{inject}, "CRASHSTATE_ROOT="+root, "CRASHSTATE_WORKLOADS="+w)
				if err != nil {
					t.Fatalf("%s: %v\n%q", inject, err, lines)
				}
				wl := splitSrv(root, ops)
				failedAt := -1
				answered := map[string]bool{}
				for _, op := range wl[0].ops {
					if op.Kind == crashstate.Mark && strings.HasPrefix(string(op.Data), "@crashtest reopened ") {
						failedAt = -1 // reopened: the store reads its file anew
					}
					if op.Injected && failedAt < 0 && (op.Kind != crashstate.Write || op.Errno != "ENOSPC") {
						failedAt = op.Seq
						fired++
					}
					switch op.Kind {
					case crashstate.Send:
						if a, ok := parseAnswer(op.Data); ok {
							if failedAt >= 0 && !answered[a.key] {
								t.Errorf("%s: answer %q sent at %s, after the store's failed %s: its storage is uncertain", inject, a.body, op, wl[0].ops[failedAt])
							}
							if failedAt < 0 {
								answered[a.key] = true
							}
						}
					case crashstate.Mark:
						if f := strings.Fields(string(op.Data)); failedAt >= 0 && len(f) >= 3 && f[1] == "ran" {
							t.Errorf("%s: handler ran for %s at %s, after the store's failed %s", inject, f[2], op, wl[0].ops[failedAt])
						}
					}
				}
				if _, err := c.check(wl[0]); err != nil {
					t.Errorf("%s: %v", inject, err)
				}
			}
		}
	}
	if fired == 0 {
		t.Fatal("no injection fired")
	}
	t.Logf("%d runs with a failed fsync or write; %d crash states checked", fired, c.states)
}

var (
	soak     = flag.Duration("soak", 0, "run the store's crash-state harness over random workloads for this long (go test -run TestCrashStatesServerSoak -soak=30m ./idemserver)")
	soakSeed = flag.Uint64("soak.seed", 0, "the first seed of -soak (0: from the clock)")
)

// srvRandom returns a random server workload of n steps for seed.
func srvRandom(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, 3))
	b := make([]byte, n)
	for i := range b {
		if r.IntN(2) == 0 {
			b[i] = srvNew
		} else {
			b[i] = srvSteps[r.IntN(len(srvSteps))]
		}
	}
	return string(b)
}

// TestCrashStatesServerSoak runs the store's harness over random
// workloads, one seed after another, for -soak (skipped without it):
// four workloads of 8 to 24 steps per seed, half the seeds with an EIO or
// ENOSPC at a random fdatasync or pwrite64. It prints the states tried
// per second every minute and every failure with its seed and crash
// point; -soak.seed=N replays from seed N.
func TestCrashStatesServerSoak(t *testing.T) {
	if *soak <= 0 {
		t.Skip("skipped: no -soak duration given")
	}
	crashstate.Need(t)
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	start := time.Now()
	deadline, next := start.Add(*soak), start.Add(time.Minute)
	var states, unique, seeds, failures int
	c := &srvChecker{dir: crashstate.TempDir(t)}
	for time.Now().Before(deadline) {
		r := rand.New(rand.NewPCG(seed, 1))
		ws := make([]string, 4)
		for i := range ws {
			ws[i] = srvRandom(seed*4+uint64(i), 8+r.IntN(17))
		}
		var inject []string
		if r.IntN(2) == 0 {
			inject = []string{fmt.Sprintf("%s:error=%s:when=%d", []string{"fdatasync", "pwrite64"}[r.IntN(2)], []string{"EIO", "ENOSPC"}[r.IntN(2)], 1+r.IntN(40))}
		}
		root := crashstate.TempDir(t)
		ops, lines, err := crashstate.Run(t, root, "crashstate-server", inject, "CRASHSTATE_ROOT="+root, "CRASHSTATE_WORKLOADS="+strings.Join(ws, ","))
		if err != nil {
			failures++
			t.Errorf("seed %d (inject %v): the child failed: %v\n%q", seed, inject, err, lines)
		}
		c.cache, c.states, c.unique = map[string]error{}, 0, 0
		for _, w := range splitSrv(root, ops) {
			if _, err := c.check(w); err != nil {
				failures++
				t.Errorf("seed %d (inject %v, -soak.seed=%d): %v", seed, inject, seed, err)
			}
		}
		states += c.states
		unique += c.unique
		seeds++
		seed++
		os.RemoveAll(root)
		if now := time.Now(); now.After(next) {
			fmt.Printf("soak: %s: %d seeds, %d crash states (%d distinct), %.0f states/s, %d failures\n",
				now.Sub(start).Round(time.Second), seeds, states, unique, float64(states)/now.Sub(start).Seconds(), failures)
			next = now.Add(time.Minute)
		}
	}
	t.Logf("soak: %s, %d seeds, %d crash states (%d distinct), %.0f states/s, %d failures", time.Since(start).Round(time.Second), seeds, states, unique, float64(states)/time.Since(start).Seconds(), failures)
}

// TestServerStoreFailedSweep: the fsyncs of a Sweep's commit fail (the
// sweep runs on the child's locked main thread: its 4th and 5th
// fdatasync, after the store's creation's three). Afterwards no handler
// runs until the store is reopened: the file's state is unknown, and a
// key whose record the sweep may have deleted must not run again while
// the first run's record may exist. Before the store refused new keys
// only after a failed Complete, the next new key ran its handler.
func TestServerStoreFailedSweep(t *testing.T) {
	crashstate.Need(t)
	c := &srvChecker{dir: crashstate.TempDir(t), cache: map[string]error{}}
	for _, n := range []int{4, 5} {
		inject := fmt.Sprintf("fdatasync:error=EIO:when=%d", n)
		root := crashstate.TempDir(t)
		ops, lines, err := crashstate.Run(t, root, "crashstate-server", []string{inject}, "CRASHSTATE_ROOT="+root, "CRASHSTATE_WORKLOADS=NSANN")
		if err != nil {
			t.Fatalf("%s: %v\n%q", inject, err, lines)
		}
		wl := splitSrv(root, ops)
		failedAt, sweeping := -1, false
		for _, op := range wl[0].ops {
			if op.Kind == crashstate.Mark && strings.Contains(string(op.Data), " sweeping ") {
				sweeping = true
			}
			if op.Injected && failedAt < 0 {
				if !sweeping {
					t.Fatalf("%s: the injection hit %s, before the sweep", inject, op)
				}
				failedAt = op.Seq
			}
			if f := strings.Fields(string(op.Data)); op.Kind == crashstate.Mark && failedAt >= 0 && len(f) >= 3 && f[1] == "ran" {
				t.Errorf("%s: handler ran for %s at %s, after the sweep's failed %s", inject, f[2], op, wl[0].ops[failedAt])
			}
		}
		if failedAt < 0 {
			t.Fatalf("%s: no injection fired", inject)
		}
		if _, err := c.check(wl[0]); err != nil {
			t.Errorf("%s: %v", inject, err)
		}
	}
}
