package pgstore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/crashtest"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// modeConsumer is the crash child of TestOnceSIGKILLBeforeCommit.
const modeConsumer = "event-consumer"

func init() {
	if crashtest.Mode() == modeConsumer {
		os.Exit(consumerChild())
	}
}

// eventFixture is a ServerStore and a table of the consumer's effects,
// one row per run of the consumer's work.
type eventFixture struct {
	s       *pgstore.ServerStore
	effects string
}

func newEventFixture(t *testing.T, opts ...pgstore.Option) *eventFixture {
	t.Helper()
	dsn := pgtest.DSN(t)
	s, err := pgstore.OpenServerStore(testContext(t), dsn, append([]pgstore.Option{pgstore.WithSchema(pgtest.Schema(t, dsn))}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	f := &eventFixture{s: s, effects: pgx.Identifier{s.Schema(), "effects"}.Sanitize()}
	_, err = s.Pool().Exec(testContext(t), `CREATE TABLE `+f.effects+` (event text NOT NULL)`) // no unique key: a second run shows
	require.NoError(t, err)
	return f
}

// consume is an idempotent consumer: in one transaction it records the
// event with Once and, on its first delivery, writes its effect; commit
// says whether it commits or rolls back.
func (f *eventFixture) consume(ctx context.Context, id string, commit bool) (first bool, err error) {
	tx, err := f.s.Pool().Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx)
	if first, err = f.s.Once(ctx, tx, "orders", id); err != nil || !first {
		return first, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+f.effects+` (event) VALUES ($1)`, id); err != nil {
		return false, err
	}
	if !commit {
		return true, tx.Rollback(ctx)
	}
	return true, tx.Commit(ctx)
}

func (f *eventFixture) runs(t *testing.T, id string) int {
	t.Helper()
	var n int
	require.NoError(t, f.s.Pool().QueryRow(testContext(t), `SELECT count(*) FROM `+f.effects+` WHERE event = $1`, id).Scan(&n))
	return n
}

func (f *eventFixture) records(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, f.s.Pool().QueryRow(testContext(t), `SELECT count(*) FROM `+pgx.Identifier{f.s.Schema(), table}.Sanitize()).Scan(&n))
	return n
}

// TestOnceRedeliveredRunsOnce delivers one event three times: the first
// delivery runs, the redeliveries are told it ran.
func TestOnceRedeliveredRunsOnce(t *testing.T) {
	f := newEventFixture(t)
	ctx := testContext(t)
	for i, want := range []bool{true, false, false} {
		first, err := f.consume(ctx, "evt-1", true)
		require.NoError(t, err)
		assert.Equal(t, want, first, "delivery %d", i+1)
	}
	first, err := f.consume(ctx, "evt-2", true)
	require.NoError(t, err)
	assert.True(t, first, "another event is new")
	assert.Equal(t, 1, f.runs(t, "evt-1"), "runs of the redelivered event")
	assert.Equal(t, 1, f.runs(t, "evt-2"))
}

// TestOnceRolledBackRunsAgain rolls the first delivery's transaction back:
// its record goes with its effect, and the redelivery runs.
func TestOnceRolledBackRunsAgain(t *testing.T) {
	f := newEventFixture(t)
	ctx := testContext(t)
	first, err := f.consume(ctx, "evt-1", false)
	require.NoError(t, err)
	require.True(t, first)
	assert.Equal(t, 0, f.runs(t, "evt-1"), "the rolled-back run left nothing")
	first, err = f.consume(ctx, "evt-1", true)
	require.NoError(t, err)
	assert.True(t, first, "the redelivery after a rollback runs")
	first, err = f.consume(ctx, "evt-1", true)
	require.NoError(t, err)
	assert.False(t, first, "and the one after its commit does not")
	assert.Equal(t, 1, f.runs(t, "evt-1"))
}

// waitForLockWait returns once a backend other than the caller's waits on a
// lock in the store's database (bounded: at most ten seconds of polls).
func waitForLockWait(t *testing.T, ctx context.Context, s *pgstore.ServerStore) {
	t.Helper()
	for range 1000 {
		var waiting bool
		require.NoError(t, s.Pool().QueryRow(ctx,
			`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database())`).Scan(&waiting))
		if waiting {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the second delivery never waited on the first")
}

// TestOnceConcurrentDeliveries delivers one event to two consumers at once:
// the second waits for the first's transaction, then skips the event if it
// committed and runs it if it rolled back. Then many consumers race for
// one event: it runs once.
func TestOnceConcurrentDeliveries(t *testing.T) {
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("first commits=%v", commit), func(t *testing.T) {
			f := newEventFixture(t)
			ctx := testContext(t)
			tx1, err := f.s.Pool().Begin(ctx)
			require.NoError(t, err)
			defer tx1.Rollback(ctx)
			first, err := f.s.Once(ctx, tx1, "orders", "evt-1")
			require.NoError(t, err)
			require.True(t, first)
			_, err = tx1.Exec(ctx, `INSERT INTO `+f.effects+` (event) VALUES ('evt-1')`)
			require.NoError(t, err)

			type result struct {
				first bool
				err   error
			}
			second := make(chan result, 1)
			go func() {
				first, err := f.consume(ctx, "evt-1", true)
				second <- result{first, err}
			}()
			waitForLockWait(t, ctx, f.s) // the second delivery waits for the first
			if commit {
				require.NoError(t, tx1.Commit(ctx))
			} else {
				require.NoError(t, tx1.Rollback(ctx))
			}
			got := <-second
			require.NoError(t, got.err)
			assert.Equal(t, !commit, got.first, "the second delivery runs only if the first rolled back")
			assert.Equal(t, 1, f.runs(t, "evt-1"), "runs of the event")
		})
	}
	t.Run("race", func(t *testing.T) {
		f := newEventFixture(t)
		ctx := testContext(t)
		const consumers = 8
		var wg sync.WaitGroup
		var mu sync.Mutex
		firsts := 0
		for range consumers {
			wg.Go(func() {
				first, err := f.consume(ctx, "evt-race", true)
				assert.NoError(t, err)
				mu.Lock()
				defer mu.Unlock()
				if first {
					firsts++
				}
			})
		}
		wg.Wait()
		assert.Equal(t, 1, firsts, "deliveries told they are first")
		assert.Equal(t, 1, f.runs(t, "evt-race"))
	})
}

// consumerChild takes one delivery, writes its effect and records the
// event, then announces it and waits to be killed before its commit.
func consumerChild() int {
	ctx := context.Background()
	s, err := pgstore.OpenServerStore(ctx, os.Getenv("IDEM_DSN"), pgstore.WithSchema(os.Getenv("IDEM_SCHEMA")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	tx, err := s.Pool().Begin(ctx)
	if err == nil {
		_, err = s.Once(ctx, tx, "orders", "evt-1")
	}
	if err == nil {
		_, err = tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{s.Schema(), "effects"}.Sanitize()+` (event) VALUES ('evt-1')`)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	crashtest.Emit("written")
	select {} // killed here: the effect and the record are written, not committed
}

// TestOnceSIGKILLBeforeCommit kills a real consumer process between its
// writes and its commit: neither its effect nor its record survives, and
// the redelivery runs.
func TestOnceSIGKILLBeforeCommit(t *testing.T) {
	f := newEventFixture(t)
	dsn := pgtest.DSN(t)
	child := crashtest.Start(t, modeConsumer, "IDEM_DSN="+dsn, "IDEM_SCHEMA="+f.s.Schema())
	require.Equal(t, []string{"written"}, child.KillWhen(func(l string) bool { return l == "written" }))
	ctx := testContext(t)
	// PostgreSQL rolls the dead backend's transaction back when it sees its
	// connection close; until then the redelivery's Once waits for it.
	first, err := f.consume(ctx, "evt-1", true)
	require.NoError(t, err)
	assert.True(t, first, "the redelivery after the crash runs")
	assert.Equal(t, 1, f.runs(t, "evt-1"), "runs: the killed one left no effect")
	assert.Equal(t, 1, f.records(t, "event_ids"), "one record, the redelivery's")
}

// TestAdvanceOutOfOrder applies versions of one entity out of order, each
// with its state write in one transaction: only newer versions apply, and
// the newest state is left. Then concurrent consumers apply a shuffled run
// of versions at once: the newest wins.
func TestAdvanceOutOfOrder(t *testing.T) {
	f := newEventFixture(t)
	ctx := testContext(t)
	state := pgx.Identifier{f.s.Schema(), "payments"}.Sanitize()
	_, err := f.s.Pool().Exec(ctx, `CREATE TABLE `+state+` (id text PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)`)
	require.NoError(t, err)
	apply := func(entity string, version int64) (bool, error) {
		tx, err := f.s.Pool().Begin(ctx)
		if err != nil {
			return false, err
		}
		defer tx.Rollback(ctx)
		applied, err := f.s.Advance(ctx, tx, "psp", entity, version)
		if err != nil || !applied {
			return applied, err
		}
		// The consumer's write, unguarded: Advance is the only order.
		if _, err := tx.Exec(ctx, `INSERT INTO `+state+` (id, status, version) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version`,
			entity, fmt.Sprintf("status-%d", version), version); err != nil {
			return false, err
		}
		return true, tx.Commit(ctx)
	}
	read := func(entity string) (status string, version int64) {
		require.NoError(t, f.s.Pool().QueryRow(ctx, `SELECT status, version FROM `+state+` WHERE id = $1`, entity).Scan(&status, &version))
		return status, version
	}
	for _, step := range []struct {
		version int64
		applied bool
	}{{3, true}, {1, false}, {2, false}, {3, false}, {5, true}, {4, false}, {-1, false}} {
		applied, err := apply("pay-1", step.version)
		require.NoError(t, err)
		assert.Equal(t, step.applied, applied, "version %d", step.version)
	}
	status, version := read("pay-1")
	assert.Equal(t, "status-5", status)
	assert.Equal(t, int64(5), version)
	applied, err := apply("pay-2", 1)
	require.NoError(t, err)
	assert.True(t, applied, "another entity has its own versions")

	var wg sync.WaitGroup
	for _, v := range []int64{7, 12, 3, 9, 20, 1, 15, 11, 19, 2} {
		wg.Go(func() {
			_, err := apply("pay-3", v)
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	status, version = read("pay-3")
	assert.Equal(t, "status-20", status, "concurrent consumers leave the newest state")
	assert.Equal(t, int64(20), version)
}

// TestEventRetentionPerScope keeps one scope's records an hour and the
// others' the default week: Sweep deletes each when its retention ends,
// and an expired record no longer makes its event a duplicate.
func TestEventRetentionPerScope(t *testing.T) {
	f := newEventFixture(t, pgstore.WithEventRetention("short", time.Hour), pgstore.WithEventRetention("none", 0))
	ctx := testContext(t)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	pgstore.SetEventClock(f.s, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	at := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	once := func(scope, id string) bool {
		tx, err := f.s.Pool().Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		first, err := f.s.Once(ctx, tx, scope, id)
		require.NoError(t, err)
		_, err = f.s.Advance(ctx, tx, scope, "entity-"+id, 1)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		return first
	}
	for _, scope := range []string{"short", "none", "other"} {
		require.True(t, once(scope, "e"))
	}
	at(time.Hour - time.Nanosecond)
	n, err := f.s.Sweep(ctx, now)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing expired a nanosecond before the hour")
	assert.False(t, once("short", "e"), "still a duplicate within its retention")

	at(time.Hour) // the short record, renewed by nothing, was written an hour ago
	n, err = f.s.Sweep(ctx, now)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the short scope's id and version")
	assert.Equal(t, 2, f.records(t, "event_ids"))
	assert.Equal(t, 2, f.records(t, "entity_versions"))

	at(pgstore.DefaultEventRetention)
	n, err = f.s.Sweep(ctx, now)
	require.NoError(t, err)
	assert.Equal(t, 4, n, "the default scopes' records after a week")
	assert.True(t, once("other", "e"), "an expired event counts as new")
}

// TestOnceInvalid refuses what cannot be recorded, with ErrInvalidEvent,
// and a closed store with idemserver's ErrClosed.
func TestOnceInvalid(t *testing.T) {
	f := newEventFixture(t)
	ctx := testContext(t)
	tx, err := f.s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	for _, c := range []struct{ scope, id string }{{"", "e"}, {"s", ""}, {"s", "a\x00b"}, {"s", "\xff"}, {"s", strings.Repeat("x", pgstore.MaxEventNameBytes+1)}} {
		_, err := f.s.Once(ctx, tx, c.scope, c.id)
		assert.ErrorIs(t, err, pgstore.ErrInvalidEvent, "%q/%q", c.scope, c.id)
		_, err = f.s.Advance(ctx, tx, c.scope, c.id, 1)
		assert.ErrorIs(t, err, pgstore.ErrInvalidEvent, "%q/%q", c.scope, c.id)
	}
	_, err = f.s.Once(ctx, nil, "s", "e")
	assert.ErrorIs(t, err, pgstore.ErrInvalidEvent)
	first, err := f.s.Once(ctx, tx, "s", "e")
	require.NoError(t, err, "the transaction is still usable")
	assert.True(t, first)
	_, err = f.s.Advance(ctx, tx, "s", "e", 1)
	require.NoError(t, err)

	_, err = tx.Exec(ctx, `SELECT 1/0`) // the transaction fails
	require.Error(t, err)
	_, err = f.s.Once(ctx, tx, "s", "e2")
	assert.True(t, errors.Is(err, idemstore.ErrJournalWrite), "a failed transaction: %v", err)
}

// TestWebhookOrderInRequestTx orders a payment provider's webhook with
// the request's transaction (RequestAdvancer): events delivered out of
// order leave the newest status, a stale one is answered 200 with
// StaleEventHeader, and a handler that fails (5xx) rolls its version back
// with its writes, so the redelivery applies it.
func TestWebhookOrderInRequestTx(t *testing.T) {
	f := newEventFixture(t)
	ctx := testContext(t)
	state := pgx.Identifier{f.s.Schema(), "payments"}.Sanitize()
	_, err := f.s.Pool().Exec(ctx, `CREATE TABLE `+state+` (id text PRIMARY KEY, status text NOT NULL)`)
	require.NoError(t, err)
	type event struct {
		Payment string `json:"payment"`
		Seq     int64  `json:"seq"`
		Status  string `json:"status"`
	}
	failNext := false
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev event
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, err := pgstore.Tx(r.Context()).Exec(r.Context(), `INSERT INTO `+state+` (id, status) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET status = excluded.status`, ev.Payment, ev.Status)
		if err != nil || failNext {
			failNext = false
			http.Error(w, "not applied", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	version := func(_ *http.Request, body []byte) (string, int64, error) {
		var ev event
		err := json.Unmarshal(body, &ev)
		return ev.Payment, ev.Seq, err
	}
	h := idemserver.New(f.s).Webhook(app, nil, idemserver.WithOrder("psp", f.s.RequestAdvancer(), version))
	deliver := func(id string, ev event) *httptest.ResponseRecorder {
		b, _ := json.Marshal(ev)
		r := httptest.NewRequest(http.MethodPost, "/hooks/psp", bytes.NewReader(b))
		r.Header.Set("webhook-id", id)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	status := func() string {
		var s string
		require.NoError(t, f.s.Pool().QueryRow(ctx, `SELECT status FROM `+state+` WHERE id = 'p1'`).Scan(&s))
		return s
	}

	assert.Equal(t, http.StatusNoContent, deliver("evt_2", event{"p1", 2, "succeeded"}).Code)
	w := deliver("evt_1", event{"p1", 1, "pending"})
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "true", w.Header().Get(idemserver.StaleEventHeader))
	assert.Equal(t, "succeeded", status(), "the late pending event did not move the payment back")

	failNext = true
	assert.Equal(t, http.StatusInternalServerError, deliver("evt_3", event{"p1", 3, "refunded"}).Code)
	assert.Equal(t, "succeeded", status(), "the failed handler's write rolled back")
	w = deliver("evt_3", event{"p1", 3, "refunded"})
	assert.Equal(t, http.StatusNoContent, w.Code, "the failed event's version rolled back with it: the redelivery applies")
	assert.Equal(t, "refunded", status())
	w = deliver("evt_3", event{"p1", 3, "refunded"})
	assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader), "a duplicate is replayed by id")

	_, err = f.s.RequestAdvancer().Advance(ctx, "psp", "p1", 9)
	assert.ErrorIs(t, err, pgstore.ErrInvalidEvent, "outside a request")
}
