package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/crashstate"
)

// workload is one recorded workload: its ops and what its child said.
type workload struct {
	index int
	steps string
	root  string // its directory
	ops   []crashstate.Op
}

// splitWorkloads cuts a recording into its workloads at the child's
// "begin" lines.
func splitWorkloads(root string, ops []crashstate.Op) []workload {
	var out []workload
	var cur *workload
	for _, op := range ops {
		if op.Kind == crashstate.Mark {
			f := strings.Fields(strings.TrimPrefix(string(op.Data), "@crashtest "))
			if len(f) >= 2 && f[0] == "begin" {
				i, _ := strconv.Atoi(f[1])
				steps := ""
				if len(f) > 2 {
					steps = f[2]
				}
				out = append(out, workload{index: i, steps: steps, root: filepath.Join(root, fmt.Sprintf("w%03d", i))})
				cur = &out[len(out)-1]
				continue
			}
		}
		if cur != nil {
			op.Seq = len(cur.ops)
			cur.ops = append(cur.ops, op)
		}
	}
	return out
}

var keyHeader = regexp.MustCompile(`(?i)\r\nIdempotency-Key: ([^\r\n]+)\r\n`)

// wireReq is a keyed request that left on the socket.
type wireReq struct {
	key, body string
}

// parseSend returns the keyed request a socket write carries, if any.
func parseSend(b []byte) (wireReq, bool) {
	if !bytes.HasPrefix(b, []byte("POST ")) {
		return wireReq{}, false
	}
	m := keyHeader.FindSubmatch(b)
	if m == nil {
		return wireReq{}, false
	}
	_, body, _ := bytes.Cut(b, []byte("\r\n\r\n"))
	return wireReq{key: string(m[1]), body: string(body)}, true
}

// marks returns the fields of an emitted line.
func markFields(op crashstate.Op) []string {
	return strings.Fields(strings.TrimPrefix(strings.TrimSpace(string(op.Data)), "@crashtest "))
}

// checkServer is the parent's stand-in for the child's server, for
// Resume and re-drives after a crash: it answers every key once
// performed with a replay, and records which operation (by body) each
// new key performed.
type checkServer struct {
	mu        sync.Mutex
	performed map[string]string // key -> body
}

func (s *checkServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	if _, ok := s.performed[key]; !ok {
		s.performed[key] = string(body)
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, "done "+string(body))
}

// clientChecker checks crash states of client workloads.
type clientChecker struct {
	t      testing.TB
	dir    string // where states are materialised
	url    string
	srv    *checkServer
	fps    map[string][32]byte // key -> fingerprint seen in a state
	cache  map[string]error
	states int
	unique int
	// refused counts states Open refused with a typed error although no
	// key had been sent (a journal that never completed its first commit).
	refused int
}

func newClientChecker(t testing.TB) *clientChecker {
	srv := &checkServer{performed: map[string]string{}}
	return &clientChecker{t: t, dir: crashstate.TempDir(t), srv: srv, url: loopback(t, srv), fps: map[string][32]byte{}, cache: map[string]error{}}
}

// check checks every crash state of w; it returns the first failure.
func (c *clientChecker) check(w workload) (points int, err error) {
	return crashstate.States(w.root, w.ops, crashstate.Options{MaxTorn: 8}, func(st crashstate.State) error {
		c.states++
		if err := c.checkState(w, st); err != nil {
			return fmt.Errorf("workload %d %q, crash after %s, state %q: %w", w.index, w.steps, w.ops[st.Point], st.Why, err)
		}
		return nil
	})
}

func (c *clientChecker) checkState(w workload, st crashstate.State) error {
	// What the caller and the server knew at the crash.
	sent := map[string]string{} // key -> body
	var sentOrder []string
	acked := map[string]int{} // key -> status the caller got
	mayGo := map[string]bool{}
	expiring := map[string]bool{}
	for _, op := range w.ops[:st.Point+1] {
		switch op.Kind {
		case crashstate.Send:
			if r, ok := parseSend(op.Data); ok {
				if _, dup := sent[r.key]; !dup {
					sentOrder = append(sentOrder, r.key)
				}
				sent[r.key] = r.body
			}
		case crashstate.Mark:
			f := markFields(op)
			switch {
			case len(f) >= 5 && f[0] == "done":
				acked[f[3]], _ = strconv.Atoi(f[4])
			case len(f) >= 1 && f[0] == "sweeping":
				for k := range acked {
					mayGo[k] = true
				}
				for k := range expiring { // expired is finished: swept too
					mayGo[k] = true
				}
			case len(f) >= 4 && f[0] == "expiring":
				expiring[f[3]] = true
			case len(f) >= 5 && f[0] == "resumed":
				acked[f[3]], _ = strconv.Atoi(f[4])
			}
		}
	}
	sort.Strings(sentOrder)
	h := st.Hash()
	ck := fmt.Sprintf("%x|%s|%v|%v", h, strings.Join(sentOrder, ","), len(mayGo), len(expiring))
	if err, ok := c.cache[ck]; ok {
		return err
	}
	c.unique++
	err := c.checkOpen(st, sent, acked, mayGo, expiring)
	c.cache[ck] = err
	return err
}

func (c *clientChecker) checkOpen(st crashstate.State, sent map[string]string, acked map[string]int, mayGo, expiring map[string]bool) (err error) {
	if err := st.Materialize(c.dir); err != nil {
		return err
	}
	path := filepath.Join(c.dir, "journal.db")
	_, statErr := os.Stat(path)
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	s, err := idem.OpenBoltStore(path, &idem.BoltOptions{ScrubDelay: -1})
	if err != nil {
		if !errors.Is(err, idem.ErrJournalCorrupt) && !errors.Is(err, idem.ErrRecordVersion) {
			return fmt.Errorf("Open: untyped error %v", err)
		}
		if len(sent) > 0 {
			return fmt.Errorf("Open refused the journal after %d keys were sent (a resume would mint new keys): %v", len(sent), err)
		}
		c.refused++
		return nil
	}
	ctx := context.Background()
	recs, err := s.Walk(ctx, "", 1<<20)
	if err != nil {
		s.Close()
		return fmt.Errorf("Walk: %v", err)
	}
	byKey := map[string]idem.Operation{}
	for _, r := range recs {
		byKey[r.Key] = r
	}
	for key, body := range sent {
		r, ok := byKey[key]
		if !ok {
			if mayGo[key] {
				continue
			}
			s.Close()
			what := "present"
			if statErr != nil {
				what = "missing"
			}
			return fmt.Errorf("key %s was sent (body %s) but is not in the recovered journal (%d records; file %s): a resume mints a new key", key, body, len(recs), what)
		}
		if fp, ok := c.fps[key]; ok && fp != r.Fingerprint {
			s.Close()
			return fmt.Errorf("key %s: fingerprint %x, another state had %x", key, r.Fingerprint, fp)
		}
		c.fps[key] = r.Fingerprint
		if status, ok := acked[key]; ok && r.State != idem.StatePending && r.State != idem.StateExpired && r.LastStatus != status {
			s.Close()
			return fmt.Errorf("key %s: the caller got %d, the journal says %s %d", key, status, r.State, r.LastStatus)
		}
		if r.State == idem.StateExpired && !expiring[key] {
			s.Close()
			return fmt.Errorf("key %s expired, never expired by the workload", key)
		}
	}
	// Resume against the server's ledger, then re-drive every operation
	// sent: each must be performed under one key only.
	c.srv.mu.Lock()
	c.srv.performed = map[string]string{}
	for k, b := range sent {
		c.srv.performed[k] = b
	}
	c.srv.mu.Unlock()
	cl := idem.New(s, append(clientOpts(), idem.WithBaseTransport(redirect{c.url}))...)
	defer func() {
		if cerr := cl.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("Close after the checks: %v", cerr)
		}
	}()
	var resumeErrs []string
	if err := cl.Resume(ctx, func(op idem.Operation, resp *http.Response, err error) {
		if resp != nil {
			resp.Body.Close()
		}
		if err != nil {
			resumeErrs = append(resumeErrs, err.Error())
		}
	}); err != nil {
		return fmt.Errorf("Resume: %v", err)
	}
	pend, err := s.Pending(ctx, "", 1000)
	if err != nil {
		return fmt.Errorf("Pending: %v", err)
	}
	if len(pend) > 0 {
		return fmt.Errorf("%d operations still pending after Resume (%s; Resume said %q)", len(pend), pend[0].Key, resumeErrs)
	}
	for key, body := range sent {
		if mayGo[key] {
			continue // swept: its name is forgotten, as retention says
		}
		name := opName(body)
		req, _ := http.NewRequestWithContext(idem.WithOperation(ctx, name), http.MethodPost, c.url+"/pay", strings.NewReader(body))
		resp, err := cl.HTTPClient().Do(req)
		if err == nil {
			resp.Body.Close()
		}
	}
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	keysOf := map[string][]string{}
	for k, b := range c.srv.performed {
		if !mayGo[k] { // a swept operation's name is forgotten: a re-drive is a new one
			keysOf[b] = append(keysOf[b], k)
		}
	}
	for b, ks := range keysOf {
		if len(ks) > 1 {
			sort.Strings(ks)
			return fmt.Errorf("operation %s performed under %d keys %v", b, len(ks), ks)
		}
	}
	return nil
}

// redirect sends every request to the checker's server: the journal
// holds the child's server's address.
type redirect struct{ url string }

func (r redirect) RoundTrip(req *http.Request) (*http.Response, error) {
	u := *req.URL
	u.Scheme, u.Host = "http", strings.TrimPrefix(r.url, "http://")
	req2 := req.Clone(req.Context())
	req2.URL, req2.Host = &u, ""
	return http.DefaultTransport.RoundTrip(req2)
}

var opNameRE = regexp.MustCompile(`"op":"([^"]+)"`)

func opName(body string) string {
	if m := opNameRE.FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return ""
}

// TestCrashStatesClientJournal is the CI subset: every workload of up to
// three steps, every persistence point, every crash state of each.
func TestCrashStatesClientJournal(t *testing.T) {
	crashstate.Need(t)
	n := 3
	if testing.Short() {
		n = 2
	}
	ws := aceWorkloads(n)
	ws = append(ws, randomWorkload(1, 12))
	root, ops, _ := recordClient(t, ws)
	c := newClientChecker(t)
	points := 0
	var failures []string
	for _, w := range splitWorkloads(root, ops) {
		p, err := c.check(w)
		points += p
		if err != nil {
			failures = append(failures, err.Error())
		}
	}
	t.Logf("%d workloads, %d persistence points, %d crash states checked (%d distinct), %d refused before any key was sent", len(ws), points, c.states, c.unique, c.refused)
	crashstate.Report(t, failures)
}

// soakInjection returns the fault a soak seed injects, or "": half the
// seeds none, the others an EIO or ENOSPC at a random fdatasync or
// pwrite64.
func soakInjection(seed uint64) string {
	r := rand.New(rand.NewPCG(seed, 7))
	if r.IntN(2) == 0 {
		return ""
	}
	sc := []string{"fdatasync", "pwrite64"}[r.IntN(2)]
	errno := []string{"EIO", "ENOSPC"}[r.IntN(2)]
	return fmt.Sprintf("%s:error=%s:when=%d", sc, errno, 1+r.IntN(40))
}

// TestCrashStatesSoak runs the harness over random workloads, one seed
// after another, for -soak (skipped without it): go test -run
// TestCrashStatesSoak -soak=30m -v . Each seed records four random
// workloads of 8 to 24 steps (with the seed's fault injected, if any)
// and checks every crash state of each. It prints the states tried per
// second every minute, and every failure with its seed and crash point;
// -soak.seed=N replays from seed N.
func TestCrashStatesSoak(t *testing.T) {
	if *soak <= 0 {
		t.Skip("skipped: no -soak duration given")
	}
	crashstate.Need(t)
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	start := time.Now()
	deadline := start.Add(*soak)
	next := start.Add(time.Minute)
	var states, unique, seeds, failures int
	c := newClientChecker(t)
	for time.Now().Before(deadline) {
		r := rand.New(rand.NewPCG(seed, 1))
		ws := make([]string, 4)
		for i := range ws {
			ws[i] = randomWorkload(seed*4+uint64(i), 8+r.IntN(17))
		}
		var inject []string
		if in := soakInjection(seed); in != "" {
			inject = []string{in}
		}
		root := crashstate.TempDir(t)
		ops, lines, err := crashstate.Run(t, root, "crashstate-client", inject,
			"CRASHSTATE_ROOT="+root, "CRASHSTATE_WORKLOADS="+strings.Join(ws, ","))
		if err != nil {
			failures++
			t.Errorf("seed %d (inject %v): the child failed: %v\n%q", seed, inject, err, lines)
		}
		c.fps, c.cache, c.states, c.unique = map[string][32]byte{}, map[string]error{}, 0, 0
		for _, w := range splitWorkloads(root, ops) {
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
			el := now.Sub(start).Seconds()
			fmt.Printf("soak: %s: %d seeds, %d crash states (%d distinct), %.0f states/s, %d failures\n",
				now.Sub(start).Round(time.Second), seeds, states, unique, float64(states)/el, failures)
			next = now.Add(time.Minute)
		}
	}
	el := time.Since(start).Seconds()
	t.Logf("soak: %s, %d seeds, %d crash states (%d distinct), %.0f states/s, %d failures", time.Since(start).Round(time.Second), seeds, states, unique, float64(states)/el, failures)
}
