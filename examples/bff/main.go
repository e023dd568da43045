// Command bff shows idem on both sides of a backend-for-frontend: a mobile
// app on a flaky network places 20 orders with a BFF, which charges each
// order at a payment provider that loses answers too and writes the order
// to its database, and every order is charged once and written once.
//
// It shows:
//   - idemserver middleware on the BFF's POST /orders: the app's
//     Idempotency-Key is required and claimed in PostgreSQL
//     (pgstore.ServerStore) before the handler runs, fleet-wide;
//   - the order row written with pgstore.Tx, in the same transaction as
//     the stored answer: they commit together, conditional on the BFF
//     still holding the key, or vanish together (a 5xx, a panic, a lost
//     key, a crash), so a retry never writes a second row;
//   - the app's retries after a lost answer get the stored answer again,
//     marked "Idempotent-Replayed: true"; a double tap while the first
//     request still runs gets 409 with Retry-After;
//   - chained keys: the BFF's charge goes through an idem client with
//     idemserver.Step(ctx, "charge"), a key derived from the app's key, so
//     every re-drive of an order reaches the provider with the same key;
//     the charge runs before the transaction begins, so no database
//     connection waits on the provider;
//   - the idem client retrying the provider's lost answers and 503s with
//     that key, and the provider replaying instead of charging again;
//   - the proof, from the provider's ledger and the BFF's orders table:
//     each order charged once and written once, and every answer the app
//     got for an order the same. The program exits with status 1
//     otherwise.
//
// It needs a PostgreSQL server (the role must be allowed to create a
// schema; the program drops the schema it made when it ends):
//
//	IDEM_TEST_POSTGRES=postgres://user:pass@127.0.0.1:5432/db go run ./examples/bff
//	go run ./examples/bff -dsn postgres://user:pass@127.0.0.1:5432/db
//
// The provider (an idemtest server) and the BFF run in this process on
// loopback. The idem client's journal is kept in a temporary directory,
// whose path is printed. The example is a module of its own, so that the
// idem module does not depend on pgx.
package main

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
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

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/pgstore"
)

const (
	orders   = 20
	workers  = 4   // orders the app places at once
	loseRate = 0.3 // share of BFF answers the app's network loses
)

func main() {
	dsn := flag.String("dsn", os.Getenv("IDEM_TEST_POSTGRES"), "PostgreSQL URL of the BFF's database (default $IDEM_TEST_POSTGRES, the variable the tests read)")
	flag.Parse()
	if *dsn == "" {
		fmt.Fprintln(os.Stderr, "bff: needs PostgreSQL: set IDEM_TEST_POSTGRES=postgres://... or pass -dsn")
		os.Exit(2)
	}
	dir, err := os.MkdirTemp("", "idem-bff-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	rep, err := run(os.Stdout, *dsn, dir)
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
	WrittenOnce, WrittenTwice                       int // order rows in the BFF's database
	Attempts, Lost, Conflicts, Replays, Answers     int
	Consistent                                      int // orders whose every answer was the same
	ProviderReplays                                 int
}

func (r report) ok() bool {
	return r.ChargedOnce == r.Orders && r.Consistent == r.Orders && r.ChargedTwice == 0 && r.NeverCharged == 0 &&
		r.WrittenOnce == r.Orders && r.WrittenTwice == 0
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

func run(out io.Writer, dsn, dir string) (report, error) {
	var rep report
	ctx := context.Background()
	led := &ledger{charges: map[string]int{}}
	provider := idemtest.NewServer(led, idemtest.WithRetryAfter(0),
		idemtest.WithFaultRates(idemtest.FaultRates{Seed: 7, DropAfter: 0.25, Unavailable: 0.1}))
	defer provider.Close()

	journalPath := filepath.Join(dir, "journal.db")
	var b [6]byte
	crand.Read(b[:])
	schema := "idem_bff_" + hex.EncodeToString(b[:])
	store, err := pgstore.OpenServerStore(ctx, dsn, pgstore.WithSchema(schema))
	if err != nil {
		return rep, err
	}
	defer store.Close()
	defer store.Pool().Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	table := pgx.Identifier{schema, "orders"}.Sanitize()
	if _, err := store.Pool().Exec(ctx, `CREATE TABLE `+table+` (id text NOT NULL, amount integer NOT NULL, charge text NOT NULL)`); err != nil {
		return rep, err
	}
	client, err := idem.Open(journalPath, idem.WithBackoff(time.Millisecond, 20*time.Millisecond), idem.WithMaxAttempts(8))
	if err != nil {
		return rep, err
	}
	defer client.Close()

	// Keys are scoped by the account the BFF's authentication found, so
	// one account's key never reaches another's answer.
	mw := idemserver.New(store, idemserver.WithPrincipal(accountOf), idemserver.WithRetryAfter(time.Second))
	defer mw.Close()
	mux := http.NewServeMux()
	mux.Handle("POST /orders", authenticate(mw.Required(orderHandler(client.HTTPClient(), provider.URL, table))))
	var lost atomic.Int64
	bff := httptest.NewServer(flakyNetwork(mux, &lost))
	defer bff.Close()

	fmt.Fprintf(out, "provider  %s (loses 25%% of its answers, 10%% 503)\n", provider.URL)
	fmt.Fprintf(out, "bff       %s (keys and orders in schema %s, journal %s)\n", bff.URL, schema, journalPath)
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

	written := map[string]int{}
	rows, err := store.Pool().Query(ctx, `SELECT id, count(*) FROM `+table+` GROUP BY id`)
	if err != nil {
		return rep, err
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return rep, err
		}
		written[id] = n
	}
	if err := rows.Err(); err != nil {
		return rep, err
	}

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
		switch written[id] {
		case 1:
			rep.WrittenOnce++
		case 0:
		default:
			rep.WrittenTwice++
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
		fmt.Fprintf(out, "order %s  %2d attempts  %d answers (%d replayed)  charge %-12s  charged %dx  written %dx\n",
			id, res.attempts, len(res.answers), res.replayed, charge, led.charges[id], written[id])
	}
	rep.Lost = int(lost.Load())
	st := provider.Stats()
	rep.ProviderReplays = st.Replays

	fmt.Fprintf(out, "\napp:      %d attempts; %d answers lost on the way back; %d x 409 in progress; %d of %d answers replayed by the BFF\n",
		rep.Attempts, rep.Lost, rep.Conflicts, rep.Replays, rep.Answers)
	fmt.Fprintf(out, "provider: %d requests, %d charges, %d lost answers replayed by key\n", st.Requests, st.Runs, st.Replays)
	if !rep.ok() {
		fmt.Fprintf(out, "FAILED: %d of %d orders charged exactly once (%d twice, %d never), %d written once (%d twice); %d with consistent answers\n",
			rep.ChargedOnce, rep.Orders, rep.ChargedTwice, rep.NeverCharged, rep.WrittenOnce, rep.WrittenTwice, rep.Consistent)
		return rep, nil
	}
	fmt.Fprintf(out, "every order charged exactly once and written exactly once; every app retry got the stored answer\n")
	return rep, nil
}

// orderHandler is the BFF's POST /orders: it charges the order at the
// provider with a key derived from the app's key, writes the order row in
// the request's transaction (committed with the stored answer) and
// answers the charge.
func orderHandler(hc *http.Client, provider, table string) http.Handler {
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
		// The charge is done (and replayed by key on a re-drive); now the
		// order row, in the transaction the middleware commits together
		// with the answer below.
		tx := pgstore.Tx(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+table+` (id, amount, charge) VALUES ($1, $2, $3)`, c.ID, c.Amount, c.Charge); err != nil {
			http.Error(w, "order not written", http.StatusInternalServerError) // 5xx: rolled back, not stored
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
// appToken is the app's session token; authenticate knows it.
const appToken = "app-session-1"

// accountKey is the context key of the account authenticate found.
type accountKey struct{}

// authenticate stands for the BFF's authentication: it answers 401 to a
// request without a known token and puts the token's account in the
// request's context.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+appToken {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, "acct_demo")))
	})
}

// accountOf is the middleware's principal function: the account
// authenticate put in the context.
func accountOf(r *http.Request) (string, error) {
	if acct, ok := r.Context().Value(accountKey{}).(string); ok {
		return acct, nil
	}
	return "", errors.New("no account in the request's context")
}

func placeOrder(hc *http.Client, bff string, o order) appResult {
	body, _ := json.Marshal(o)
	key := "app-" + o.ID + "-" + strconv.Itoa(o.Amount)
	var res appResult
	var mu sync.Mutex
	send := func() (bool, time.Duration) {
		req, _ := http.NewRequest(http.MethodPost, bff+"/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Authorization", "Bearer "+appToken)
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
