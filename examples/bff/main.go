// Command bff shows idem on both sides of a backend-for-frontend: a mobile
// app on a flaky network places 20 orders with a BFF, which charges each
// order at a payment provider that loses answers too, writes the order to
// its database and enqueues its receipt e-mail; the provider's webhooks
// arrive late, twice and out of order; and every order is charged once,
// written once, moved to "succeeded" once and never back, and its receipt
// sent once.
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
//   - side effects bound to the key (package idemriver): the receipt
//     e-mail is a River job inserted with idemriver.Enqueue in the same
//     transaction as the order row and the stored answer, so the job
//     exists if and only if the answer does; River's worker sends it to a
//     mail provider that loses answers, through the idem client, under a
//     key derived from the app's key and the step "receipt", so River's
//     retries and idem's are replayed, never sent twice;
//   - an idempotent worker write: the worker records the receipt in the
//     BFF's database with pgstore's ServerStore.Once in its own
//     transaction, so a job River runs again writes it once;
//   - the payment provider's webhooks (payment.pending, then
//     payment.succeeded, delivered late, twice and out of order) on an
//     idemserver Webhook route that runs once per event id and, with
//     idemserver.WithOrder and ServerStore.RequestAdvancer, in version
//     order per payment: a "pending" that arrives after "succeeded" is
//     answered 200 with Idem-Stale-Event: true and does not move the order
//     back;
//   - the proof, from the providers' ledgers and the BFF's tables: each
//     order charged once, written once, paid once and left "succeeded",
//     its receipt sent once and recorded once, and every answer the app
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
// loopback, with River's queue in the BFF's schema (migrated with
// rivermigrate). The idem client's journal is kept in a temporary
// directory, whose path is printed. The example is a module of its own, so
// that the idem module does not depend on pgx or River.
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
	"log/slog"
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
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemriver"
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
	// The payment provider's webhooks: orders left "succeeded", events
	// whose handler ran more than once, stale events answered without a
	// run, duplicate deliveries replayed.
	Succeeded, EventsTwice, Stale, HookReplays int
	// Receipts: orders whose receipt the mail provider sent once (and
	// more than once), receipts recorded once by the worker, mail
	// answers the provider replayed by key.
	MailedOnce, MailedTwice, ReceiptsOnce, MailReplays int
}

func (r report) ok() bool {
	return r.ChargedOnce == r.Orders && r.Consistent == r.Orders && r.ChargedTwice == 0 && r.NeverCharged == 0 &&
		r.WrittenOnce == r.Orders && r.WrittenTwice == 0 &&
		r.Succeeded == r.Orders && r.EventsTwice == 0 &&
		r.MailedOnce == r.Orders && r.MailedTwice == 0 && r.ReceiptsOnce == r.Orders
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
	mail := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted) // the e-mail goes out
	}), idemtest.WithRetryAfter(0), idemtest.WithFaultRates(idemtest.FaultRates{Seed: 11, DropAfter: 0.3}))
	defer mail.Close()

	journalPath := filepath.Join(dir, "journal.db")
	var b [6]byte
	crand.Read(b[:])
	schema := "idem_bff_" + hex.EncodeToString(b[:])
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return rep, err
	}
	cfg.MaxConns = 24 // requests in flight, webhooks, River's workers and its listener
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return rep, err
	}
	defer pool.Close()
	store, err := pgstore.NewServerStore(ctx, pool, pgstore.WithSchema(schema))
	if err != nil {
		return rep, err
	}
	defer store.Close()
	defer pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	t := tables{
		orders:   pgx.Identifier{schema, "orders"}.Sanitize(),
		payments: pgx.Identifier{schema, "payment_events"}.Sanitize(),
		receipts: pgx.Identifier{schema, "receipts"}.Sanitize(),
	}
	for _, q := range []string{
		`CREATE TABLE ` + t.orders + ` (id text NOT NULL, amount integer NOT NULL, charge text NOT NULL, payment text NOT NULL DEFAULT 'none')`,
		`CREATE TABLE ` + t.payments + ` (event text NOT NULL, order_id text NOT NULL, status text NOT NULL)`,
		`CREATE TABLE ` + t.receipts + ` (order_id text NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return rep, err
		}
	}
	// River's own tables, in the BFF's schema.
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema})
	if err != nil {
		return rep, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return rep, err
	}
	client, err := idem.Open(journalPath, idem.WithBackoff(time.Millisecond, 20*time.Millisecond), idem.WithMaxAttempts(8))
	if err != nil {
		return rep, err
	}
	defer client.Close()

	jobWorkers := river.NewWorkers()
	river.AddWorker(jobWorkers, idemriver.Work(receiptWorker(client.HTTPClient(), mail.URL, store, t)))
	queue, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:            schema,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:           jobWorkers,
		FetchPollInterval: 100 * time.Millisecond,
		Logger:            slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return rep, err
	}
	if err := queue.Start(ctx); err != nil {
		return rep, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		queue.Stop(sctx)
	}()

	// Keys are scoped by the account the BFF's authentication found, so
	// one account's key never reaches another's answer.
	mw := idemserver.New(store, idemserver.WithPrincipal(accountOf), idemserver.WithRetryAfter(time.Second))
	defer mw.Close()
	// The provider's webhooks carry no account: a middleware of their own
	// (over the same store) scopes them by their event id.
	hookMW := idemserver.New(store, idemserver.WithRetryAfter(time.Second))
	defer hookMW.Close()
	mux := http.NewServeMux()
	mux.Handle("POST /orders", authenticate(mw.Required(orderHandler(client.HTTPClient(), provider.URL, queue, t))))
	mux.Handle("POST /hooks/psp", hookMW.Webhook(paymentHook(t), idemserver.JSONEventID("id"),
		idemserver.WithOrder("psp", store.RequestAdvancer(), paymentVersion)))
	var lost atomic.Int64
	bff := httptest.NewServer(flakyNetwork(mux, &lost))
	defer bff.Close()

	fmt.Fprintf(out, "provider  %s (loses 25%% of its answers, 10%% 503)\n", provider.URL)
	fmt.Fprintf(out, "mail      %s (loses 30%% of its answers)\n", mail.URL)
	fmt.Fprintf(out, "bff       %s (keys, orders and River's jobs in schema %s, journal %s)\n", bff.URL, schema, journalPath)
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

	// The payment provider's webhooks, for every order: "succeeded" (seq 2)
	// first, then the "pending" (seq 1) it sent before, late, then
	// "succeeded" again, a redelivery.
	hooks := hookStats{}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	for i := range orders {
		id := fmt.Sprintf("o-%02d", i+1)
		for _, ev := range []paymentEvent{
			{ID: "evt_" + id + "_2", Payment: id, Seq: 2, Status: "succeeded"},
			{ID: "evt_" + id + "_1", Payment: id, Seq: 1, Status: "pending"},
			{ID: "evt_" + id + "_2", Payment: id, Seq: 2, Status: "succeeded"},
		} {
			hooks.deliver(hc, bff.URL+"/hooks/psp", ev)
		}
	}

	// The receipts go out in the background; wait for River to finish them.
	jobs := pgx.Identifier{schema, "river_job"}.Sanitize()
	for tries := 0; ; tries++ {
		var pending int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+jobs+` WHERE state <> 'completed'`).Scan(&pending); err != nil {
			return rep, err
		}
		if pending == 0 || tries == 600 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	written, err := countBy(ctx, pool, `SELECT id, count(*) FROM `+t.orders+` GROUP BY id`)
	if err != nil {
		return rep, err
	}
	runs, err := countBy(ctx, pool, `SELECT event, count(*) FROM `+t.payments+` GROUP BY event`)
	if err != nil {
		return rep, err
	}
	recorded, err := countBy(ctx, pool, `SELECT order_id, count(*) FROM `+t.receipts+` GROUP BY order_id`)
	if err != nil {
		return rep, err
	}
	succeeded, err := countBy(ctx, pool, `SELECT id, count(*) FROM `+t.orders+` WHERE payment = 'succeeded' GROUP BY id`)
	if err != nil {
		return rep, err
	}
	mailed := map[string]int{}
	keyOf, err := receiptKeys(ctx, pool, jobs)
	if err != nil {
		return rep, err
	}
	ms := mail.Stats()
	for id, key := range keyOf {
		mailed[id] = ms.RunsByKey[key]
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
		switch mailed[id] {
		case 1:
			rep.MailedOnce++
		case 0:
		default:
			rep.MailedTwice++
		}
		if recorded[id] == 1 {
			rep.ReceiptsOnce++
		}
		if succeeded[id] == 1 {
			rep.Succeeded++
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
		fmt.Fprintf(out, "order %s  %2d attempts  %d answers (%d replayed)  charge %-12s  charged %dx  written %dx  paid %dx  receipt mailed %dx\n",
			id, res.attempts, len(res.answers), res.replayed, charge, led.charges[id], written[id], runs["evt_"+id+"_2"], mailed[id])
	}
	for _, n := range runs {
		if n > 1 {
			rep.EventsTwice++
		}
	}
	rep.Stale, rep.HookReplays = hooks.stale, hooks.replayed
	rep.Lost = int(lost.Load())
	st := provider.Stats()
	rep.ProviderReplays = st.Replays
	rep.MailReplays = ms.Replays

	fmt.Fprintf(out, "\napp:      %d attempts; %d answers lost on the way back; %d x 409 in progress; %d of %d answers replayed by the BFF\n",
		rep.Attempts, rep.Lost, rep.Conflicts, rep.Replays, rep.Answers)
	fmt.Fprintf(out, "provider: %d requests, %d charges, %d lost answers replayed by key\n", st.Requests, st.Runs, st.Replays)
	fmt.Fprintf(out, "webhooks: %d deliveries, %d stale (older than the payment's state) answered without a run, %d duplicates replayed by event id\n",
		hooks.sent, rep.Stale, rep.HookReplays)
	fmt.Fprintf(out, "mail:     %d requests, %d receipts sent, %d lost answers replayed by key\n", ms.Requests, ms.Runs, ms.Replays)
	if !rep.ok() {
		fmt.Fprintf(out, "FAILED: %d of %d orders charged exactly once (%d twice, %d never), %d written once (%d twice); %d with consistent answers; "+
			"%d left succeeded, %d events run twice; %d receipts mailed once (%d twice), %d recorded once\n",
			rep.ChargedOnce, rep.Orders, rep.ChargedTwice, rep.NeverCharged, rep.WrittenOnce, rep.WrittenTwice, rep.Consistent,
			rep.Succeeded, rep.EventsTwice, rep.MailedOnce, rep.MailedTwice, rep.ReceiptsOnce)
		return rep, nil
	}
	fmt.Fprintf(out, "every order charged exactly once and written exactly once; every app retry got the stored answer\n")
	fmt.Fprintf(out, "every payment applied once and in order; every receipt sent exactly once\n")
	return rep, nil
}

// tables are the BFF's tables, schema-qualified.
type tables struct {
	orders, payments, receipts string
}

// countBy runs q, which selects (text, count) rows, into a map.
func countBy(ctx context.Context, pool *pgxpool.Pool, q string) (map[string]int, error) {
	rows, err := pool.Query(ctx, q)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}

// receiptKeys returns the idempotency key of each order's receipt job.
func receiptKeys(ctx context.Context, pool *pgxpool.Pool, jobs string) (map[string]string, error) {
	rows, err := pool.Query(ctx, `SELECT args->>'order', metadata->>'`+idemriver.MetadataKey+`' FROM `+jobs+` WHERE kind = 'receipt'`)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for rows.Next() {
		var id, key string
		if err := rows.Scan(&id, &key); err != nil {
			return nil, err
		}
		out[id] = key
	}
	return out, rows.Err()
}

// orderHandler is the BFF's POST /orders: it charges the order at the
// provider with a key derived from the app's key, then, in the request's
// transaction (committed with the stored answer), writes the order row
// and enqueues the receipt e-mail, and answers the charge.
func orderHandler(hc *http.Client, provider string, queue *river.Client[pgx.Tx], t tables) http.Handler {
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
		// order row and the receipt job, in the transaction the middleware
		// commits together with the answer below.
		tx := pgstore.Tx(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+t.orders+` (id, amount, charge) VALUES ($1, $2, $3)`, c.ID, c.Amount, c.Charge); err != nil {
			http.Error(w, "order not written", http.StatusInternalServerError) // 5xx: rolled back, not stored
			return
		}
		if _, err := idemriver.Enqueue(r.Context(), queue, "receipt", receiptArgs{Order: c.ID, Amount: c.Amount, Charge: c.Charge}, nil); err != nil {
			http.Error(w, "receipt not queued", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(c)
	})
}

// receiptArgs is the River job that e-mails an order's receipt.
type receiptArgs struct {
	Order  string `json:"order"`
	Amount int    `json:"amount"`
	Charge string `json:"charge"`
}

// Kind implements river.JobArgs.
func (receiptArgs) Kind() string { return "receipt" }

// receiptWorker sends the receipt through the idem client, whose context
// carries the job's key (idemriver.Work), then records it in the BFF's
// database once, whatever River runs again (ServerStore.Once in the
// worker's own transaction).
func receiptWorker(hc *http.Client, mail string, store *pgstore.ServerStore, t tables) func(context.Context, *river.Job[receiptArgs]) error {
	return func(ctx context.Context, job *river.Job[receiptArgs]) error {
		body, _ := json.Marshal(job.Args) // from the args only: the same on every attempt
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, mail+"/v1/messages", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return err // River retries the job; the key is the same
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("mail provider: %s", resp.Status)
		}
		return pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			first, err := store.Once(ctx, tx, "receipt-sent", job.Args.Order)
			if err != nil || !first {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO `+t.receipts+` (order_id) VALUES ($1)`, job.Args.Order)
			return err
		})
	}
}

// paymentEvent is the payment provider's webhook body.
type paymentEvent struct {
	ID      string `json:"id"`
	Payment string `json:"payment"` // the order it pays
	Seq     int64  `json:"seq"`     // grows with the payment's state
	Status  string `json:"status"`
}

// paymentVersion is the webhook route's idemserver.EventVersion: the
// payment and its sequence number.
func paymentVersion(_ *http.Request, body []byte) (string, int64, error) {
	var ev paymentEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		return "", 0, err
	}
	return ev.Payment, ev.Seq, nil
}

// paymentHook is POST /hooks/psp, behind a Webhook route that runs it once
// per event id and only for a version newer than the payment's: it moves
// the order's payment status and logs the event, in the request's
// transaction.
func paymentHook(t tables) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev paymentEvent
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
			http.Error(w, "bad event", http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		tx := pgstore.Tx(ctx)
		if _, err := tx.Exec(ctx, `UPDATE `+t.orders+` SET payment = $2 WHERE id = $1`, ev.Payment, ev.Status); err != nil {
			http.Error(w, "not applied", http.StatusInternalServerError)
			return
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+t.payments+` (event, order_id, status) VALUES ($1, $2, $3)`, ev.ID, ev.Payment, ev.Status); err != nil {
			http.Error(w, "not applied", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// hookStats is what the payment provider saw of its deliveries.
type hookStats struct {
	sent, stale, replayed int
}

// deliver sends ev until the BFF answers 2xx (bounded), as a webhook
// sender retries.
func (h *hookStats) deliver(hc *http.Client, url string, ev paymentEvent) {
	body, _ := json.Marshal(ev)
	for tries := 0; tries < 100; tries++ {
		h.sent++
		resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if resp.Header.Get(idemserver.StaleEventHeader) == "true" {
			h.stale++
		}
		if resp.Header.Get(idemserver.ReplayedHeader) == "true" {
			h.replayed++
		}
		return
	}
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
