package idemserver_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/internal/crashtest"
)

// The crash tests run a server in a child process (this test binary,
// re-executed by crashtest from TestMain), kill it with SIGKILL while a
// handler holds a key, and check what the next process makes of the files
// the dead one left.

func init() {
	crashChildren["hold"] = childHold
	crashChildren["bff"] = childBFF
}

const crashLease = 30 * time.Second

// fixedClock is a clock tests set by hand; safe for concurrent use.
type fixedClock struct{ ns atomic.Int64 }

func (c *fixedClock) set(t time.Time)  { c.ns.Store(t.UnixNano()) }
func (c *fixedClock) now() time.Time   { return time.Unix(0, c.ns.Load()) }
func newClock(t time.Time) *fixedClock { c := &fixedClock{}; c.set(t); return c }

// childHold completes one request ("done"), then starts another ("held")
// whose handler announces itself and hangs until the parent kills it. Its
// clock stands still at t0, so the parent knows when the lease ends.
func childHold() int {
	s, err := idemserver.OpenBoltStore(os.Getenv("IDEM_STORE"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	mw := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithLease(crashLease))
	idemserver.SetClock(mw, newClock(t0).now)
	h := mw.Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "held" {
			crashtest.Emit("running")
			select {} // killed here, holding the key
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "child's answer")
	}))
	w := do(h, req{key: "done", body: "a"})
	crashtest.Emit("done", fmt.Sprint(w.Code))
	do(h, req{key: "held", body: "b"})
	return 1 // not reached
}

// TestBoltStoreAfterSIGKILL: a stored answer survives SIGKILL and is
// replayed; a key whose handler was running when the process died is free
// at once after the restart (its claim lived in the dead process only, and
// no handler of it can still run), so the retry runs the handler.
func TestBoltStoreAfterSIGKILL(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	child := crashtest.Start(t, "hold", "IDEM_STORE="+path)
	lines := child.KillWhen(func(l string) bool { return l == "running" })
	require.Equal(t, []string{"done 201", "running"}, lines)

	s, err := idemserver.OpenBoltStore(path, nil) // the dead child's lock is gone
	require.NoError(t, err)
	defer s.Close()
	clock := newClock(t0.Add(time.Second))
	mw := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithLease(crashLease))
	idemserver.SetClock(mw, clock.now)
	a := &app{}
	h := mw.Required(a)

	// The completed request survived the crash and is replayed.
	w := do(h, req{key: "done", body: "a"})
	assert.Equal(t, http.StatusCreated, w.Code)
	assert.Equal(t, "child's answer", w.Body.String())
	assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader))

	// The dead handler's key is free well within its lease.
	w = do(h, req{key: "held", body: "b"})
	assert.Equal(t, http.StatusCreated, w.Code)
	assert.Empty(t, w.Header().Get(idemserver.ReplayedHeader))
	assert.EqualValues(t, 1, a.runs.Load())
	assert.Equal(t, "true", do(h, req{key: "held", body: "b"}).Header().Get(idemserver.ReplayedHeader))
}

// bffLease is the lease of the BFF children: short, so the app's retry
// after a crash waits for it in real time only briefly.
const bffLease = time.Second

// childBFF serves a BFF on loopback: POST /orders (key required) charges
// the order at the provider through an idem client, with the charge's key
// derived from the order's. The first answer to each app key is lost on
// the way back (the connection is closed after the handler finished).
func childBFF() int {
	store, err := idemserver.OpenBoltStore(os.Getenv("IDEM_STORE"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer store.Close()
	client, err := idem.Open(os.Getenv("IDEM_JOURNAL"),
		idem.WithBaseTransport(&http.Transport{DisableKeepAlives: true}),
		idem.WithBackoff(time.Millisecond, 20*time.Millisecond), idem.WithMaxAttempts(10))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer client.Close()
	mw := idemserver.New(store, idemserver.WithSingleTenant(), idemserver.WithLease(bffLease))
	orders := mw.Required(bffOrders(client.HTTPClient(), os.Getenv("IDEM_PROVIDER")))

	var mu sync.Mutex
	seen := map[string]bool{}
	root := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		lose := !seen[key]
		seen[key] = true
		mu.Unlock()
		if !lose {
			orders.ServeHTTP(w, r)
			return
		}
		orders.ServeHTTP(httptest.NewRecorder(), r)
		panic(http.ErrAbortHandler) // the answer is lost on the way back
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	crashtest.Emit("listening", "http://"+ln.Addr().String())
	err = (&http.Server{Handler: root}).Serve(ln) // serves until killed
	fmt.Fprintln(os.Stderr, err)
	return 1
}

// order is the app's request to the BFF and charge the provider's answer.
type order struct {
	ID     string `json:"order"`
	Amount int    `json:"amount"`
	Charge string `json:"charge,omitempty"`
}

// bffOrders charges an order at the provider and answers with the charge.
func bffOrders(hc *http.Client, provider string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var o order
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		body, _ := json.Marshal(order{ID: o.ID, Amount: o.Amount}) // byte-identical on every re-drive
		ctx := idemserver.Step(r.Context(), "charge")
		preq, _ := http.NewRequestWithContext(ctx, http.MethodPost, provider+"/v1/charges", strings.NewReader(string(body)))
		preq.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(preq)
		if err != nil {
			http.Error(w, "provider unreachable", http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		var c order
		if resp.StatusCode != http.StatusCreated || json.NewDecoder(resp.Body).Decode(&c) != nil {
			http.Error(w, "provider said "+resp.Status, http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(c)
	})
}

// ledger is the provider's record of charges per order.
type ledger struct {
	mu      sync.Mutex
	charges map[string]int
	hold    string        // the order whose charge is held...
	held    chan struct{} // ...closed when it is charged...
	release chan struct{} // ...and answered once this is closed
}

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var o order
	if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
		http.Error(w, "bad charge", http.StatusBadRequest)
		return
	}
	l.mu.Lock()
	l.charges[o.ID]++
	n := l.charges[o.ID]
	l.mu.Unlock()
	if o.ID == l.hold && n == 1 {
		close(l.held)
		<-l.release
	}
	o.Charge = fmt.Sprintf("ch_%s_%d", o.ID, n)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(o)
}

// appResult is what the app learned about one order.
type appResult struct {
	answers  []order // every 201 it got
	replayed int     // how many of them were marked replayed
	attempts int
}

// placeOrder is the mobile app: it retries the order under one key until
// it gets a 201 (bounded), then asks once more as a user tapping twice
// would, and returns what it got.
func placeOrder(t *testing.T, bff func() string, o order) appResult {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	body, _ := json.Marshal(o)
	key := "app-" + o.ID
	var res appResult
	for res.attempts = 1; res.attempts <= 600 && len(res.answers) < 2; res.attempts++ {
		req, _ := http.NewRequest(http.MethodPost, bff()+"/orders", strings.NewReader(string(body)))
		req.Header.Set("Idempotency-Key", key)
		resp, err := hc.Do(req)
		if err != nil {
			time.Sleep(50 * time.Millisecond) // the flaky network or a restarting BFF
			continue
		}
		var got order
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || err != nil {
			time.Sleep(50 * time.Millisecond) // 409 while the dead BFF's lease runs
			continue
		}
		res.answers = append(res.answers, got)
		if resp.Header.Get(idemserver.ReplayedHeader) == "true" {
			res.replayed++
		}
	}
	if len(res.answers) < 2 {
		t.Errorf("order %s: %d answers after %d attempts", o.ID, len(res.answers), res.attempts)
	}
	return res
}

func TestChainedKeysEndToEndWithSIGKILL(t *testing.T) {
	dir := t.TempDir()
	l := &ledger{charges: map[string]int{}, hold: "o-crash", held: make(chan struct{}), release: make(chan struct{})}
	// The provider loses its first answer to every key.
	provider := idemtest.NewServer(l, idemtest.WithRetryAfter(0), idemtest.WithScript(func(key string, attempt int) idemtest.Fault {
		if attempt == 1 {
			return idemtest.DropAfter
		}
		return idemtest.NoFault
	}))
	defer provider.Close()
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(l.release) })

	env := []string{"IDEM_STORE=" + filepath.Join(dir, "keys.db"), "IDEM_JOURNAL=" + filepath.Join(dir, "journal.db"), "IDEM_PROVIDER=" + provider.URL}
	var bffURL atomic.Value
	startBFF := func() *crashtest.Child {
		c := crashtest.Start(t, "bff", env...)
		line, ok := c.Next()
		require.True(t, ok, "the BFF child ended before listening")
		url, ok := strings.CutPrefix(line, "listening ")
		require.True(t, ok, line)
		bffURL.Store(url)
		return c
	}
	bff := func() string { return bffURL.Load().(string) }

	first := startBFF()
	results := map[string]appResult{}
	for i := 1; i <= 3; i++ {
		o := order{ID: fmt.Sprintf("o-%d", i), Amount: 1000 * i}
		results[o.ID] = placeOrder(t, bff, o)
	}

	// The crash: the BFF dies while the provider holds a charge it made.
	crashed := make(chan appResult)
	go func() { crashed <- placeOrder(t, bff, order{ID: "o-crash", Amount: 4200}) }()
	<-l.held
	first.Kill()
	releaseOnce.Do(func() { close(l.release) })
	second := startBFF()
	results["o-crash"] = <-crashed
	results["o-after"] = placeOrder(t, bff, order{ID: "o-after", Amount: 7})
	second.Kill()

	l.mu.Lock()
	defer l.mu.Unlock()
	for id, res := range results {
		assert.Equal(t, 1, l.charges[id], "order %s charged once", id)
		require.Len(t, res.answers, 2, id)
		assert.Equal(t, res.answers[0], res.answers[1], "order %s: the retry got the stored answer", id)
		assert.Equal(t, fmt.Sprintf("ch_%s_1", id), res.answers[0].Charge, id)
		assert.GreaterOrEqual(t, res.replayed, 1, "order %s: answers replayed by the BFF", id)
	}
	st := provider.Stats()
	assert.Zero(t, st.DuplicateKeys(), "the provider ran no key twice")
	assert.Positive(t, st.Replays, "the provider replayed lost answers")
}
