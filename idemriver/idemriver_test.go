package idemriver_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemriver"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/internal/crashtest"
	"github.com/idemgo/idem/pgstore"
)

// The crash children of this package's tests.
const (
	modeServer = "idemriver-server" // TestJobIffAnswerAcrossSIGKILL
	modeWorker = "idemriver-worker" // TestWorkerKilledMidCallSendsOneKey
)

func TestMain(m *testing.M) {
	switch crashtest.Mode() {
	case modeServer:
		os.Exit(serverChild())
	case modeWorker:
		os.Exit(workerChild())
	}
	if os.Getenv(envDSN) == "" && os.Getenv("CI") != "true" {
		fmt.Fprintf(os.Stderr, "idemriver: PostgreSQL tests skipped: set %s=postgres://user:pass@127.0.0.1:5432/db to run them\n", envDSN)
	}
	os.Exit(m.Run())
}

const envDSN = "IDEM_TEST_POSTGRES"

// testDSN returns the test server's URL, or skips t (fails it with CI=true).
func testDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv(envDSN)
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set and CI=true: the PostgreSQL tests are required in CI", envDSN)
		}
		t.Skipf("no PostgreSQL: set %s=postgres://... to run this test", envDSN)
	}
	return dsn
}

// ReceiptArgs is the job of the tests: send order's receipt.
type ReceiptArgs struct {
	Order string `json:"order"`
}

// Kind implements river.JobArgs.
func (ReceiptArgs) Kind() string { return "receipt" }

// fixture is one test's schema: a ServerStore, River's tables migrated by
// rivermigrate, an orders table, and a River client that only inserts.
type fixture struct {
	dsn    string
	s      *pgstore.ServerStore
	river  *river.Client[pgx.Tx]
	orders string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dsn := testDSN(t)
	ctx := t.Context()
	var b [6]byte
	rand.Read(b[:])
	schema := "idemriver_" + hex.EncodeToString(b[:])
	s, err := pgstore.OpenServerStore(ctx, dsn, pgstore.WithSchema(schema)) // creates the schema
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := s.Pool().Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		assert.NoError(t, err)
		s.Close()
	})
	migrator, err := rivermigrate.New(riverpgxv5.New(s.Pool()), &rivermigrate.Config{Schema: schema})
	require.NoError(t, err)
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)
	rc, err := insertClient(s.Pool(), schema)
	require.NoError(t, err)
	f := &fixture{dsn: dsn, s: s, river: rc, orders: pgx.Identifier{schema, "orders"}.Sanitize()}
	_, err = s.Pool().Exec(ctx, `CREATE TABLE `+f.orders+` (id text NOT NULL)`) // no unique key: a second row shows
	require.NoError(t, err)
	return f
}

// insertClient is a River client that inserts jobs and works none.
func insertClient(pool *pgxpool.Pool, schema string) (*river.Client[pgx.Tx], error) {
	return river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: schema})
}

// count returns the rows of q.
func (f *fixture) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.s.Pool().QueryRow(t.Context(), q, args...).Scan(&n))
	return n
}

// state counts the order rows, the stored answers and the receipt jobs.
func (f *fixture) state(t *testing.T) (rows, answers, jobs int) {
	t.Helper()
	schema := f.s.Schema()
	return f.count(t, `SELECT count(*) FROM `+f.orders),
		f.count(t, `SELECT count(*) FROM `+pgx.Identifier{schema, "inbound_keys"}.Sanitize()+` WHERE status IS NOT NULL`),
		f.count(t, `SELECT count(*) FROM `+pgx.Identifier{schema, "river_job"}.Sanitize()+` WHERE kind = 'receipt'`)
}

// jobKeys returns the idempotency keys of the receipt jobs.
func (f *fixture) jobKeys(t *testing.T) []string {
	t.Helper()
	rows, err := f.s.Pool().Query(t.Context(), `SELECT metadata->>'idem_key' FROM `+pgx.Identifier{f.s.Schema(), "river_job"}.Sanitize()+` WHERE kind = 'receipt'`)
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return keys
}

// orderHandler is POST /orders: the order row and the receipt job in the
// request's transaction, then 201. at is called at each named step.
func orderHandler(rc *river.Client[pgx.Tx], orders string, at func(step string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		var o ReceiptArgs
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if _, err := pgstore.Tx(ctx).Exec(ctx, `INSERT INTO `+orders+` (id) VALUES ($1)`, o.Order); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		at("before-enqueue")
		if _, err := idemriver.Enqueue(ctx, rc, "receipt", o, nil); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		at("after-enqueue")
		w.WriteHeader(http.StatusCreated)
	})
}

// stepWriter calls at("after-commit") when the middleware passes its
// answer on: after the answer (and the transaction) committed.
type stepWriter struct {
	http.ResponseWriter
	at func(step string)
}

func (s stepWriter) WriteHeader(code int) { s.at("after-commit"); s.ResponseWriter.WriteHeader(code) }

// app scopes the tests' keys by the principal of the one mobile app.
var app = idemserver.WithPrincipal(func(*http.Request) (string, error) { return "app", nil })

// crashLease is the lease of the server child's key: the parent's retry
// waits for it to lapse, in real time.
const crashLease = time.Second

const orderBody = `{"order":"o-1"}`

func postOrder(h http.Handler) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(orderBody))
	r.Header.Set("Idempotency-Key", "app-order-1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// serverChild serves one order and is killed at the step IDEM_KILL_AT.
func serverChild() int {
	ctx := context.Background()
	s, err := pgstore.OpenServerStore(ctx, os.Getenv("IDEM_DSN"), pgstore.WithSchema(os.Getenv("IDEM_SCHEMA")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rc, err := insertClient(s.Pool(), s.Schema())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	at := func(step string) {
		if step == os.Getenv("IDEM_KILL_AT") {
			crashtest.Emit(step)
			select {} // killed here
		}
	}
	h := idemserver.New(s, app, idemserver.WithLease(crashLease)).Required(orderHandler(rc, pgx.Identifier{s.Schema(), "orders"}.Sanitize(), at))
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(orderBody))
	r.Header.Set("Idempotency-Key", "app-order-1")
	h.ServeHTTP(stepWriter{httptest.NewRecorder(), at}, r)
	return 1 // not reached
}

// TestJobIffAnswerAcrossSIGKILL kills a real server process at each step of
// a handler that writes its order row and enqueues its receipt job with
// Enqueue: before the enqueue, after it, and after the answer's commit.
// After each kill the order row, the stored answer and the job are all
// there or none is; the app's retry on another replica then leaves one of
// each, and the job's key is the one the retry derives.
func TestJobIffAnswerAcrossSIGKILL(t *testing.T) {
	for _, tt := range []struct {
		step string
		kept int // rows, answers and jobs after the kill
	}{{"before-enqueue", 0}, {"after-enqueue", 0}, {"after-commit", 1}} {
		t.Run(tt.step, func(t *testing.T) {
			f := newFixture(t)
			child := crashtest.Start(t, modeServer, "IDEM_DSN="+f.dsn, "IDEM_SCHEMA="+f.s.Schema(), "IDEM_KILL_AT="+tt.step)
			require.Equal(t, []string{tt.step}, child.KillWhen(func(l string) bool { return l == tt.step }))

			// PostgreSQL ends the dead backend's transaction when it sees
			// its connection close; the reads below may wait for that.
			rows, answers, jobs := f.state(t)
			assert.Equal(t, []int{tt.kept, tt.kept, tt.kept}, []int{rows, answers, jobs}, "rows, answers, jobs after the kill")

			var key string
			h := idemserver.New(f.s, app, idemserver.WithLease(crashLease)).Required(orderHandler(f.river, f.orders, func(string) {}))
			keyed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) })
			probe := idemserver.New(idemserver.NewMemoryStore(), app).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				key, _ = idemserver.StepKey(r.Context(), "receipt") // what the handler derives for this request
			}))
			postOrder(probe)
			var w *httptest.ResponseRecorder
			for i := 0; ; i++ { // the app's retries, until the dead replica's lease lapses
				w = postOrder(keyed)
				if w.Code != http.StatusConflict || i == 100 {
					break
				}
				time.Sleep(crashLease / 10)
			}
			require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
			assert.Equal(t, tt.kept == 1, w.Header().Get(idemserver.ReplayedHeader) == "true", "replayed iff the first answer was committed")
			rows, answers, jobs = f.state(t)
			assert.Equal(t, []int{1, 1, 1}, []int{rows, answers, jobs}, "rows, answers, jobs after the retry")
			assert.Equal(t, []string{key}, f.jobKeys(t), "the job carries the key derived from the app's key and the step")
		})
	}
}

// workerChild works receipt jobs: each sends the receipt to IDEM_MAIL
// through an idem Client on the journal IDEM_JOURNAL, under the job's key.
// It announces "working" and "done", and exits once a job is done.
func workerChild() int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 2 }
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_DSN"))
	if err != nil {
		return fail(err)
	}
	client, err := idem.Open(os.Getenv("IDEM_JOURNAL"), idem.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		return fail(err)
	}
	done := make(chan struct{}, 1)
	workers := river.NewWorkers()
	river.AddWorker(workers, idemriver.Work(func(ctx context.Context, job *river.Job[ReceiptArgs]) error {
		key, _ := idemriver.Key(job.JobRow)
		crashtest.Emit("working", key, fmt.Sprint(job.Attempt))
		body, _ := json.Marshal(job.Args)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, os.Getenv("IDEM_MAIL")+"/v1/send", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.HTTPClient().Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("mail provider: %s", resp.Status)
		}
		crashtest.Emit("done", key)
		done <- struct{}{}
		return nil
	}))
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:               os.Getenv("IDEM_SCHEMA"),
		Queues:               map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
		Workers:              workers,
		JobTimeout:           rescueAfter, // the parent kills the call well before
		RescueStuckJobsAfter: rescueAfter, // a killed worker's job is retried after that
		RetryPolicy:          retryNow{},
		FetchPollInterval:    100 * time.Millisecond,
		Logger:               childLogger(),
	})
	if err != nil {
		return fail(err)
	}
	if err := rc.Start(ctx); err != nil {
		return fail(err)
	}
	<-done
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	rc.Stop(sctx)
	client.Close()
	pool.Close()
	return 0
}

// rescueAfter is how long a worker's job may run before River rescues it
// (retries it on another worker): in real time.
const rescueAfter = 2 * time.Second

// retryNow retries a failed or rescued job at once.
type retryNow struct{}

func (retryNow) NextRetry(*rivertype.JobRow) time.Time { return time.Now() }

// TestWorkerKilledMidCallSendsOneKey enqueues a receipt job through an
// idempotent order handler, lets a real worker process take it and kills
// it (SIGKILL) while the mail provider performs the send, then lets River
// rescue the job on a second worker process with a journal of its own:
// the provider sees the job's key twice and sends the receipt once.
func TestWorkerKilledMidCallSendsOneKey(t *testing.T) {
	f := newFixture(t)
	calls := make(chan string, 4)
	killed := make(chan struct{})
	first := true
	mail := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls <- r.Header.Get("Idempotency-Key") // the receipt is sent (a replay by key does not get here)
		if first {
			first = false
			<-killed // the worker dies before it hears of it
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer mail.Close()

	h := idemserver.New(f.s, app).Required(orderHandler(f.river, f.orders, func(string) {}))
	require.Equal(t, http.StatusCreated, postOrder(h).Code)
	keys := f.jobKeys(t)
	require.Len(t, keys, 1)
	key := keys[0]

	dir := t.TempDir()
	env := []string{"IDEM_DSN=" + f.dsn, "IDEM_SCHEMA=" + f.s.Schema(), "IDEM_MAIL=" + mail.URL}
	w1 := crashtest.Start(t, modeWorker, append(env, "IDEM_JOURNAL="+filepath.Join(dir, "w1.db"))...)
	line, ok := w1.Next()
	require.True(t, ok, "the first worker took the job")
	assert.Equal(t, "working "+key+" 1", line)
	assert.Equal(t, key, <-calls, "the first call's key")
	w1.Kill() // mid-call: the provider performed the send, the worker never hears of it
	close(killed)

	// The dead worker was River's leader (it alone ran); its leadership
	// would lapse after River's TTL, which the test ends at once so that
	// the second worker leads at its start. Its rescuer runs at once
	// (then every 30 s): start it once the job has run for longer than
	// RescueStuckJobsAfter, so that its first run finds the job stuck.
	_, err := f.s.Pool().Exec(t.Context(), `DELETE FROM `+pgx.Identifier{f.s.Schema(), "river_leader"}.Sanitize())
	require.NoError(t, err)
	for range 100 {
		if f.count(t, `SELECT count(*) FROM `+pgx.Identifier{f.s.Schema(), "river_job"}.Sanitize()+
			` WHERE state = 'running' AND attempted_at < now() - $1::interval`, (rescueAfter+rescueAfter/4).String()) == 1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	w2 := crashtest.Start(t, modeWorker, append(env, "IDEM_JOURNAL="+filepath.Join(dir, "w2.db"))...)
	var lines []string
	for {
		line, ok := w2.Next()
		if !ok {
			break
		}
		lines = append(lines, line)
	}
	_, err = w2.Wait()
	require.NoError(t, err, "the second worker finished the job")
	assert.Equal(t, []string{"working " + key + " 2", "done " + key}, lines, "River retried the job with the same key")

	st := mail.Stats()
	assert.Equal(t, 1, st.Runs, "receipts sent")
	assert.Equal(t, map[string]int{key: 1}, st.RunsByKey)
	assert.Equal(t, map[string]int{key: 2}, st.AttemptsByKey, "one key, two attempts")
	assert.Equal(t, 1, st.Replays, "the retry got the stored answer")
	var state string
	require.NoError(t, f.s.Pool().QueryRow(t.Context(), `SELECT state FROM `+pgx.Identifier{f.s.Schema(), "river_job"}.Sanitize()).Scan(&state))
	assert.Equal(t, "completed", state)
}

// TestEnqueueOutsideRequest refuses to enqueue without a keyed request, and
// a worker cancels a job that carries no key.
func TestEnqueueOutsideRequest(t *testing.T) {
	f := newFixture(t)
	_, err := idemriver.Enqueue(t.Context(), f.river, "receipt", ReceiptArgs{Order: "o"}, nil)
	assert.ErrorIs(t, err, idemriver.ErrNoRequest)
	_, err = idemriver.Key(&rivertype.JobRow{ID: 7, Metadata: []byte(`{}`)})
	assert.ErrorIs(t, err, idemriver.ErrNoKey)

	tx, err := f.s.Pool().Begin(t.Context())
	require.NoError(t, err)
	defer tx.Rollback(t.Context())
	res, err := idemriver.EnqueueTx(t.Context(), f.river, tx, "evt-key", "receipt", ReceiptArgs{Order: "o"},
		&river.InsertOpts{Metadata: []byte(`{"tenant":"t1"}`)})
	require.NoError(t, err)
	key, err := idemriver.Key(res.Job)
	require.NoError(t, err)
	assert.Equal(t, "evt-key", key)
	var meta map[string]string
	require.NoError(t, json.Unmarshal(res.Job.Metadata, &meta))
	assert.Equal(t, "t1", meta["tenant"], "the caller's metadata is kept")
	_, err = idemriver.EnqueueTx(t.Context(), f.river, tx, "", "receipt", ReceiptArgs{}, nil)
	assert.ErrorIs(t, err, idemriver.ErrNoKey)

	w := idemriver.Work(func(context.Context, *river.Job[ReceiptArgs]) error { return errors.New("ran") })
	err = w.Work(t.Context(), &river.Job[ReceiptArgs]{JobRow: &rivertype.JobRow{ID: 8}})
	var cancel *river.JobCancelError
	assert.ErrorAs(t, err, &cancel, "a job without a key is cancelled, not run")
}

// childLogger logs River's warnings to standard error, which the test
// shows when it fails.
func childLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
