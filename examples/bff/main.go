// Command bff shows idem on both sides of a backend-for-frontend: a mobile
// app on a flaky network places 20 orders with a BFF, which charges each
// order at a payment provider that loses answers too, and every order is
// charged exactly once.
//
// It shows:
//   - idemserver middleware on the BFF's POST /orders: the app's
//     Idempotency-Key is required, claimed in a bbolt store before the
//     handler runs, and the answer stored before it is sent;
//   - the app's retries after a lost answer get the stored answer again,
//     marked "Idempotent-Replayed: true"; a double tap while the first
//     request still runs gets 409 with Retry-After;
//   - chained keys: the BFF's charge goes through an idem client with
//     idemserver.Step(ctx, "charge"), a key derived from the app's key, so
//     every re-drive of an order reaches the provider with the same key;
//   - the idem client retrying the provider's lost answers and 503s with
//     that key, and the provider replaying instead of charging again;
//   - the proof, from the provider's own ledger: each order charged once,
//     and every answer the app got for an order the same. The program
//     exits with status 1 otherwise.
//
// The provider (an idemtest server) and the BFF run in this process on
// loopback; nothing needs setting up. The BFF's key store and the idem
// journal are kept in a temporary directory, whose path is printed.
//
// Run it with: go run ./examples/bff
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/idemtest"
)

const (
	orders   = 20
	workers  = 4   // orders the app places at once
	loseRate = 0.3 // share of BFF answers the app's network loses
)

func main() {
	dir, err := os.MkdirTemp("", "idem-bff-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	rep, err := run(os.Stdout, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bff:", err)
		os.Exit(1)
	}
	if !rep.ok() {
		os.Exit(1)
	}
}

// report is what a run found; the test checks it.
type report struct {
	Orders, ChargedOnce, ChargedTwice, NeverCharged int
	Attempts, Lost, Conflicts, Replays, Answers     int
	Consistent                                      int // orders whose every answer was the same
	ProviderReplays                                 int
}

func (r report) ok() bool {
	return r.ChargedOnce == r.Orders && r.Consistent == r.Orders && r.ChargedTwice == 0 && r.NeverCharged == 0
}

// order is the app's request, the BFF's answer and the provider's charge.
type order struct {
	ID     string `json:"order"`
	Amount int    `json:"amount"`
	Charge string `json:"charge,omitempty"`
}

// ledger is the provider's record of charges.
type ledger struct {
	mu      sync.Mutex
	charges map[string]int
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
	time.Sleep(5 * time.Millisecond) // the card network
	o.Charge = fmt.Sprintf("ch_%s_%d", o.ID, n)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(o)
}

func run(out io.Writer, dir string) (report, error) {
	var rep report
	led := &ledger{charges: map[string]int{}}
	provider := idemtest.NewServer(led, idemtest.WithRetryAfter(0),
		idemtest.WithFaultRates(idemtest.FaultRates{Seed: 7, DropAfter: 0.25, Unavailable: 0.1}))
	defer provider.Close()

	storePath, journalPath := filepath.Join(dir, "keys.db"), filepath.Join(dir, "journal.db")
	store, err := idemserver.OpenBoltStore(storePath, nil)
	if err != nil {
		return rep, err
	}
	defer store.Close()
	client, err := idem.Open(journalPath, idem.WithBackoff(time.Millisecond, 20*time.Millisecond), idem.WithMaxAttempts(8))
	if err != nil {
		return rep, err
	}
	defer client.Close()

	mw := idemserver.New(store, idemserver.WithRetryAfter(time.Second))
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Required(orderHandler(client.HTTPClient(), provider.URL)))
	var lost atomic.Int64
	bff := httptest.NewServer(flakyNetwork(mux, &lost))
	defer bff.Close()

	fmt.Fprintf(out, "provider  %s (loses 25%% of its answers, 10%% 503)\n", provider.URL)
	fmt.Fprintf(out, "bff       %s (keys %s, journal %s)\n", bff.URL, storePath, journalPath)
	fmt.Fprintf(out, "app       %d orders, %d at a time, %.0f%% of answers lost on the way back\n\n", orders, workers, loseRate*100)

	results := make([]appResult, orders)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
			for {
				i := int(next.Add(1)) - 1
				if i >= orders {
					return
				}
				results[i] = placeOrder(hc, bff.URL, order{ID: fmt.Sprintf("o-%02d", i+1), Amount: 100 * (i + 1)})
			}
		}()
	}
	wg.Wait()

	led.mu.Lock()
	defer led.mu.Unlock()
	rep.Orders = orders
	for i, res := range results {
		id := fmt.Sprintf("o-%02d", i+1)
		switch n := led.charges[id]; {
		case n == 1:
			rep.ChargedOnce++
		case n == 0:
			rep.NeverCharged++
		default:
			rep.ChargedTwice++
		}
		same := len(res.answers) > 0
		for _, a := range res.answers {
			same = same && a == res.answers[0]
		}
		if same {
			rep.Consistent++
		}
		rep.Attempts += res.attempts
		rep.Conflicts += res.conflicts
		rep.Replays += res.replayed
		rep.Answers += len(res.answers)
		charge := "none"
		if len(res.answers) > 0 {
			charge = res.answers[0].Charge
		}
		fmt.Fprintf(out, "order %s  %2d attempts  %d answers (%d replayed)  charge %-12s  charged %dx\n",
			id, res.attempts, len(res.answers), res.replayed, charge, led.charges[id])
	}
	rep.Lost = int(lost.Load())
	st := provider.Stats()
	rep.ProviderReplays = st.Replays

	fmt.Fprintf(out, "\napp:      %d attempts; %d answers lost on the way back; %d x 409 in progress; %d of %d answers replayed by the BFF\n",
		rep.Attempts, rep.Lost, rep.Conflicts, rep.Replays, rep.Answers)
	fmt.Fprintf(out, "provider: %d requests, %d charges, %d lost answers replayed by key\n", st.Requests, st.Runs, st.Replays)
	if !rep.ok() {
		fmt.Fprintf(out, "FAILED: %d of %d orders charged exactly once (%d twice, %d never); %d with consistent answers\n",
			rep.ChargedOnce, rep.Orders, rep.ChargedTwice, rep.NeverCharged, rep.Consistent)
		return rep, nil
	}
	fmt.Fprintf(out, "every order charged exactly once; every app retry got the stored answer\n")
	return rep, nil
}

// orderHandler is the BFF's POST /orders: it charges the order at the
// provider with a key derived from the app's key and answers the charge.
func orderHandler(hc *http.Client, provider string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var o order
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil || o.ID == "" {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		body, _ := json.Marshal(order{ID: o.ID, Amount: o.Amount}) // byte-identical on every re-drive
		ctx := idemserver.Step(r.Context(), "charge")
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, provider+"/v1/charges", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			http.Error(w, "provider unreachable", http.StatusBadGateway) // 5xx: not stored, the app retries
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

// flakyNetwork loses some of the BFF's answers after the BFF produced
// them: the app sees a dropped connection although its order went through.
func flakyNetwork(h http.Handler, lost *atomic.Int64) http.Handler {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		lose := rng.Float64() < loseRate
		mu.Unlock()
		if !lose {
			h.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
		lost.Add(1)
		panic(http.ErrAbortHandler) // the server closes the connection, silently
	})
}

// appResult is what the app learned about one order.
type appResult struct {
	answers   []order
	replayed  int
	conflicts int
	attempts  int
}

// placeOrder is the mobile app: it places an order under one key, taps
// twice at once on the first try, retries lost answers, 409s and 5xx with
// the same key (bounded), and once it has an answer asks once more, as an
// app back from the background does.
func placeOrder(hc *http.Client, bff string, o order) appResult {
	body, _ := json.Marshal(o)
	key := "app-" + o.ID + "-" + strconv.Itoa(o.Amount)
	var res appResult
	var mu sync.Mutex
	send := func() (bool, time.Duration) {
		req, _ := http.NewRequest(http.MethodPost, bff+"/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		mu.Lock()
		defer mu.Unlock()
		res.attempts++
		if err != nil {
			return false, 20 * time.Millisecond
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusConflict {
			res.conflicts++
			return false, 50 * time.Millisecond // Retry-After says 1s; an impatient app
		}
		var got order
		if resp.StatusCode != http.StatusCreated || json.NewDecoder(resp.Body).Decode(&got) != nil {
			return false, 20 * time.Millisecond
		}
		res.answers = append(res.answers, got)
		if resp.Header.Get(idemserver.ReplayedHeader) == "true" {
			res.replayed++
		}
		return true, 0
	}
	// The double tap: two requests at once.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); send() }()
	ok, wait := send()
	wg.Wait()
	for tries := 0; !ok && len(res.answers) == 0 && tries < 100; tries++ {
		time.Sleep(wait)
		ok, wait = send()
	}
	// Back from the background: ask again, get the same answer.
	for tries := 0; tries < 100; tries++ {
		if ok, wait = send(); ok {
			break
		}
		time.Sleep(wait)
	}
	return res
}
