package pgstore_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// TestPgBouncerOpenNamesCause opens a Store and a ServerStore through a
// real PgBouncer in transaction pooling mode with pgx's default query
// mode, whose named prepared statements do not survive the pooler: Open
// fails with an error that says so and what to put in the DSN.
func TestPgBouncerOpenNamesCause(t *testing.T) {
	dsn := pgtest.DSN(t)
	bouncer := pgtest.Bouncer(t, dsn)
	ctx := testContext(t)
	schema := pgtest.Schema(t, dsn)
	s, err := pgstore.Open(ctx, bouncer, pgstore.WithSchema(schema))
	if err == nil {
		s.Close()
	}
	require.Error(t, err, "Open through PgBouncer with named prepared statements")
	t.Logf("Open: %v", err)
	assert.ErrorIs(t, err, pgstore.ErrPooler)
	assert.Contains(t, err.Error(), "default_query_exec_mode=exec", "the error names the DSN setting")

	ss, err := pgstore.OpenServerStore(ctx, bouncer, pgstore.WithSchema(schema))
	if err == nil {
		ss.Close()
	}
	assert.ErrorIs(t, err, pgstore.ErrPooler, "OpenServerStore")
}

// TestPgBouncerClient pays orders through a Client on a Store behind a real
// PgBouncer in transaction pooling mode, with the DSN setting the package
// documents for it: every order is charged once, a second call of a name
// is replayed, and Close writes every mark. (The KeyStore conformance
// suite cannot run through it: its test clock lives in the connection's
// search_path, which a transaction pooler does not keep.)
func TestPgBouncerClient(t *testing.T) {
	dsn := pgtest.DSN(t)
	bouncer := withParam(pgtest.Bouncer(t, dsn), "default_query_exec_mode=exec")
	ctx := testContext(t)
	s, err := pgstore.Open(ctx, bouncer, pgstore.WithSchema(pgtest.Schema(t, dsn)))
	require.NoError(t, err)
	srv := idemtest.NewServer(http.HandlerFunc(charges))
	defer srv.Close()
	c := idem.New(s, quickRetries)
	for i := range 20 {
		status, err := pay(ctx, c.HTTPClient(), srv.URL, fmt.Sprintf("order-%d", i%10))
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, status)
	}
	pending, err := s.Pending(ctx, "", 0)
	require.NoError(t, err)
	assert.Empty(t, names(pending), "operations left pending")
	rec, err := s.Get(ctx, keyOf(t, s, "pay:order-3"))
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
	assert.Equal(t, 10, srv.Stats().Runs, "charges: one per order")
	require.NoError(t, c.Close())
}

// TestPgBouncerServerStore runs idempotent handlers through a real
// PgBouncer in transaction pooling mode, in the simple protocol: a
// request that writes its row in the request's transaction, its replay,
// and the same key with another payload.
func TestPgBouncerServerStore(t *testing.T) {
	dsn := pgtest.DSN(t)
	bouncer := withParam(pgtest.Bouncer(t, dsn), "default_query_exec_mode=simple_protocol")
	s := openServerStore(t, bouncer, pgtest.Schema(t, dsn))
	table := ordersTable(t, s)
	runs := 0
	h := idemserver.New(s, idemserver.WithSingleTenant()).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		if _, err := pgstore.Tx(r.Context()).Exec(r.Context(), `INSERT INTO `+table+` (key) VALUES ($1)`, r.Header.Get("Idempotency-Key")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order":1}`))
	}))
	first := postKey(t, h, "order-1", "a")
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	replay := postKey(t, h, "order-1", "a")
	assert.Equal(t, http.StatusCreated, replay.Code)
	assert.Equal(t, "true", replay.Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, `{"order":1}`, replay.Body.String())
	other := postKey(t, h, "order-1", "b")
	assert.Equal(t, http.StatusUnprocessableEntity, other.Code, strings.TrimSpace(other.Body.String()))
	assert.Equal(t, 1, runs, "handler runs")
	assert.Equal(t, 1, countRows(t, s, table, "order-1"), "rows the handler wrote")
}
