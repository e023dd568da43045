package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// ordersTable creates the handler's own table in schema, with a unique
// key checked at commit (deferred), and returns its sanitized name.
func ordersTable(t *testing.T, s *pgstore.ServerStore) string {
	t.Helper()
	table := pgx.Identifier{s.Schema(), "orders"}.Sanitize()
	_, err := s.Pool().Exec(testContext(t), `CREATE TABLE `+table+` (
		key text NOT NULL,
		CONSTRAINT orders_key UNIQUE (key) DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	return table
}

func countRows(t *testing.T, s *pgstore.ServerStore, table, key string) int {
	t.Helper()
	var n int
	require.NoError(t, s.Pool().QueryRow(testContext(t), `SELECT count(*) FROM `+table+` WHERE key = $1`, key).Scan(&n))
	return n
}

// TestTxRowsAndAnswerTogether: the handler's rows commit with its stored
// answer, and a 5xx, a 429 or a panic rolls them back with it.
func TestTxRowsAndAnswerTogether(t *testing.T) {
	dsn := pgtest.DSN(t)
	s := openServerStore(t, dsn, pgtest.Schema(t, dsn))
	table := ordersTable(t, s)
	tests := []struct {
		name   string
		answer func(w http.ResponseWriter)
		rows   int
	}{
		{"201 commits", func(w http.ResponseWriter) { w.WriteHeader(http.StatusCreated) }, 1},
		{"500 rolls back", func(w http.ResponseWriter) { w.WriteHeader(http.StatusInternalServerError) }, 0},
		{"429 rolls back", func(w http.ResponseWriter) { w.WriteHeader(http.StatusTooManyRequests) }, 0},
		{"panic rolls back", func(http.ResponseWriter) { panic("boom") }, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := idemserver.New(s, idemserver.WithSingleTenant()).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tx := pgstore.Tx(r.Context())
				require.NotNil(t, tx)
				_, err := tx.Exec(r.Context(), `INSERT INTO `+table+` (key) VALUES ($1)`, tt.name)
				require.NoError(t, err)
				tt.answer(w)
			}))
			func() {
				defer func() { recover() }()
				w := postKey(t, h, strings.ReplaceAll(tt.name, " ", "-"), "x")
				assert.NotEqual(t, http.StatusBadRequest, w.Code, w.Body.String())
			}()
			assert.Equal(t, tt.rows, countRows(t, s, table, tt.name))
		})
	}
	assert.Nil(t, pgstore.Tx(context.Background()), "outside a request")
}

// TestTxRefusedCommit: a commit PostgreSQL refuses (a deferred unique
// constraint) leaves no row and no 2xx; the retry writes the one row.
func TestTxRefusedCommit(t *testing.T) {
	dsn := pgtest.DSN(t)
	s := openServerStore(t, dsn, pgtest.Schema(t, dsn))
	table := ordersTable(t, s)
	runs := 0
	h := idemserver.New(s, idemserver.WithSingleTenant()).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		tx := pgstore.Tx(r.Context())
		for range 3 - runs { // the first run inserts twice: refused at commit
			_, err := tx.Exec(r.Context(), `INSERT INTO `+table+` (key) VALUES ('order-1')`)
			require.NoError(t, err)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	w := postKey(t, h, "order-1", "x")
	assert.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
	var doc struct{ Type string }
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &doc))
	assert.Equal(t, idemserver.ProblemNotStored, doc.Type)
	assert.Zero(t, countRows(t, s, table, "order-1"), "no row after the refused commit")

	w = postKey(t, h, "order-1", "x")
	assert.Equal(t, http.StatusCreated, w.Code, "the retry runs on a clean slate: %s", w.Body.String())
	assert.Equal(t, 1, countRows(t, s, table, "order-1"))
	assert.Equal(t, "true", postKey(t, h, "order-1", "x").Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, 2, runs)
}

// cutOff is a ServerStore whose renewals fail, as for a replica cut off
// from the database while its handler's connection still works.
type cutOff struct{ *pgstore.ServerStore }

func (cutOff) Renew(context.Context, string, string, time.Time, time.Time) error {
	return idem.ErrJournalWrite
}

// TestTxFencing: a handler whose renewals fail is cancelled before its
// lease lapses; its rows roll back and its client gets 503, and the
// replica that takes the key over writes the one row.
func TestTxFencing(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	s := openServerStore(t, dsn, schema)
	table := ordersTable(t, s)
	const lease = 2 * time.Second
	insert := func(w http.ResponseWriter, r *http.Request) error {
		_, err := pgstore.Tx(r.Context()).Exec(r.Context(), `INSERT INTO `+table+` (key) VALUES ('k')`)
		return err
	}
	var cause error
	a := idemserver.New(cutOff{s}, idemserver.WithSingleTenant(), idemserver.WithLease(lease)).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, insert(w, r))
		<-r.Context().Done()
		cause = context.Cause(r.Context())
		w.WriteHeader(http.StatusCreated)
	}))
	w := postKey(t, a, "k", "x")
	assert.ErrorIs(t, cause, idemserver.ErrLockLost)
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Zero(t, countRows(t, s, table, "k"))

	b := idemserver.New(openServerStore(t, dsn, schema), idemserver.WithSingleTenant(), idemserver.WithLease(lease)).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, insert(w, r))
		w.WriteHeader(http.StatusCreated)
	}))
	for i := 0; ; i++ { // until A's lease lapses, by the database's clock
		w = postKey(t, b, "k", "x")
		if w.Code != http.StatusConflict || i == 100 {
			break
		}
		time.Sleep(lease / 20)
	}
	assert.Equal(t, http.StatusCreated, w.Code)
	assert.Equal(t, 1, countRows(t, s, table, "k"))
}

// TestServerStoreSkewedReplicaClock: leases are judged by the database's
// clock, so a replica whose clock runs an hour ahead cannot take a live
// key, and one whose clock lags an hour still sees a lapsed one lapse.
func TestServerStoreSkewedReplicaClock(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	a, b := openServerStore(t, dsn, schema), openServerStore(t, dsn, schema)
	ctx := testContext(t)
	begin := func(s *pgstore.ServerStore, id string, skew, lease time.Duration) idemserver.Claim {
		now := time.Now().Add(skew)
		c, err := s.Begin(ctx, idemserver.Begin{ID: id, Fingerprint: "f", Now: now, LeaseUntil: now.Add(lease)})
		require.NoError(t, err)
		return c
	}
	held := begin(a, "live", 0, time.Minute)
	require.Equal(t, idemserver.StateAcquired, held.State)
	assert.Equal(t, idemserver.StateInFlight, begin(b, "live", time.Hour, time.Minute).State, "a replica an hour ahead")
	// A's completion with a clock an hour behind still holds the key.
	past := time.Now().Add(-time.Hour)
	require.NoError(t, a.Complete(ctx, idemserver.Completion{ID: "live", Token: held.Token,
		Response: &idemserver.Response{Status: 201}, Now: past, Until: past.Add(time.Hour)}))
	assert.Equal(t, idemserver.StateDone, begin(b, "live", 2*time.Hour, time.Minute).State, "kept an hour by the database's clock")

	lapsing := begin(a, "short", 0, 300*time.Millisecond)
	require.Equal(t, idemserver.StateAcquired, lapsing.State)
	time.Sleep(400 * time.Millisecond)
	assert.Equal(t, idemserver.StateAcquired, begin(b, "short", -time.Hour, time.Minute).State, "a replica an hour behind")
	err := a.Complete(ctx, idemserver.Completion{ID: "short", Token: lapsing.Token,
		Response: &idemserver.Response{Status: 201}, Now: time.Now(), Until: time.Now().Add(time.Hour)})
	assert.True(t, errors.Is(err, idemserver.ErrLockLost), "the old holder's completion: %v", err)
}

// TestServerStoreConditionalComplete: a completion after the lease lapsed
// is refused even when nobody took the key over, by the database's clock.
func TestServerStoreConditionalComplete(t *testing.T) {
	dsn := pgtest.DSN(t)
	s := openServerStore(t, dsn, pgtest.Schema(t, dsn))
	ctx := testContext(t)
	now := time.Now()
	c, err := s.Begin(ctx, idemserver.Begin{ID: "k", Fingerprint: "f", Now: now, LeaseUntil: now.Add(200 * time.Millisecond)})
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	future := time.Now().Add(-time.Hour) // a replica that believes the lease is live
	err = s.Complete(ctx, idemserver.Completion{ID: "k", Token: c.Token, Response: &idemserver.Response{Status: 200},
		Now: future, Until: future.Add(time.Hour)})
	assert.ErrorIs(t, err, idemserver.ErrLockLost)
	err = s.Renew(ctx, "k", c.Token, future, future.Add(time.Minute))
	assert.ErrorIs(t, err, idemserver.ErrLockLost)
}

// TestServerStoreNotKept: a "done, not kept" record round-trips.
func TestServerStoreNotKept(t *testing.T) {
	dsn := pgtest.DSN(t)
	s := openServerStore(t, dsn, pgtest.Schema(t, dsn))
	h := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithMaxResponseBytes(10)).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprint(w, "more than ten bytes")
	}))
	w := postKey(t, h, "k", "x")
	require.Equal(t, http.StatusAccepted, w.Code)
	w = postKey(t, h, "k", "x")
	assert.Equal(t, http.StatusConflict, w.Code)
	var doc struct {
		Type           string
		OriginalStatus int `json:"original_status"`
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &doc))
	assert.Equal(t, idemserver.ProblemNotKept, doc.Type)
	assert.Equal(t, http.StatusAccepted, doc.OriginalStatus)
}

// TestTxCaughtStatementError: a handler whose INSERT hits a unique index
// catches the error and answers 409; PostgreSQL aborted the transaction,
// so the answer is stored after a rollback to the savepoint taken before
// the handler ran, and a retry is a replay, not a second run. A handler
// that answers 2xx over an aborted transaction gets a 500 problem saying
// so, and nothing of it commits.
func TestTxCaughtStatementError(t *testing.T) {
	dsn := pgtest.DSN(t)
	s := openServerStore(t, dsn, pgtest.Schema(t, dsn))
	table := pgx.Identifier{s.Schema(), "names"}.Sanitize()
	_, err := s.Pool().Exec(testContext(t), `CREATE TABLE `+table+` (name text PRIMARY KEY)`)
	require.NoError(t, err)
	_, err = s.Pool().Exec(testContext(t), `INSERT INTO `+table+` (name) VALUES ('taken')`)
	require.NoError(t, err)

	t.Run("4xx stored", func(t *testing.T) {
		runs := 0
		h := idemserver.New(s, idemserver.WithSingleTenant()).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			tx := pgstore.Tx(r.Context())
			_, err := tx.Exec(r.Context(), `INSERT INTO `+table+` (name) VALUES ('other')`)
			require.NoError(t, err)
			_, err = tx.Exec(r.Context(), `INSERT INTO `+table+` (name) VALUES ('taken')`)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "23505" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusConflict)
				w.Write([]byte(`{"error":"name taken"}`))
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		for i := range 3 {
			w := postKey(t, h, "name-1", "x")
			assert.Equal(t, http.StatusConflict, w.Code, "try %d: %s", i, w.Body.String())
			assert.Equal(t, `{"error":"name taken"}`, w.Body.String(), "try %d", i)
			assert.Equal(t, i > 0, w.Header().Get(idemserver.ReplayedHeader) == "true", "try %d", i)
		}
		assert.Equal(t, 1, runs, "the handler ran once")
		var n int
		require.NoError(t, s.Pool().QueryRow(testContext(t), `SELECT count(*) FROM `+table+` WHERE name = 'other'`).Scan(&n))
		assert.Zero(t, n, "the handler's work before the failed statement rolled back")
	})

	t.Run("2xx refused", func(t *testing.T) {
		runs := 0
		h := idemserver.New(s, idemserver.WithSingleTenant()).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			tx := pgstore.Tx(r.Context())
			_, _ = tx.Exec(r.Context(), `INSERT INTO `+table+` (name) VALUES ('taken')`) // the bug: the error is dropped
			w.WriteHeader(http.StatusCreated)
		}))
		w := postKey(t, h, "name-2", "x")
		assert.Equal(t, http.StatusInternalServerError, w.Code, w.Body.String())
		var doc struct{ Type, Detail string }
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &doc))
		assert.Equal(t, idemserver.ProblemTxAborted, doc.Type)
		assert.Contains(t, doc.Detail, "201")
		assert.Equal(t, 1, runs)
	})
}
