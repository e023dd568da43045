package pgstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// openStore opens a Store on a schema of its own, closed when t ends.
func openStore(t *testing.T, opts ...pgstore.Option) *pgstore.Store {
	t.Helper()
	dsn := pgtest.DSN(t)
	s, err := pgstore.Open(testContext(t), dsn, append([]pgstore.Option{pgstore.WithSchema(pgtest.Schema(t, dsn))}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func migrationVersions(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) []int {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT version FROM `+pgx.Identifier{schema, "migrations"}.Sanitize()+` ORDER BY version`)
	require.NoError(t, err)
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return vs
}

func TestOpenCreatesSchema(t *testing.T) {
	s := openStore(t)
	ctx := testContext(t)
	assert.Equal(t, []int{1}, migrationVersions(t, ctx, s.Pool(), s.Schema()))
	var n int
	require.NoError(t, s.Pool().QueryRow(ctx,
		`SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name = 'operations'`, s.Schema()).Scan(&n))
	assert.Equal(t, 1, n, "operations table")
}

// TestConcurrentOpen starts several replicas on one fresh schema at once:
// the advisory lock lets exactly one of them migrate, and none fails.
func TestConcurrentOpen(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	ctx := testContext(t)
	const replicas = 6
	stores := make([]*pgstore.Store, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() { stores[i], errs[i] = pgstore.Open(ctx, dsn, pgstore.WithSchema(schema)) })
	}
	wg.Wait()
	for i := range replicas {
		require.NoError(t, errs[i], "replica %d", i)
		defer stores[i].Close()
	}
	assert.Equal(t, []int{1}, migrationVersions(t, ctx, stores[0].Pool(), schema))
}

func TestReopenKeepsSchema(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	ctx := testContext(t)
	for range 2 {
		s, err := pgstore.Open(ctx, dsn, pgstore.WithSchema(schema))
		require.NoError(t, err)
		assert.Equal(t, []int{1}, migrationVersions(t, ctx, s.Pool(), schema))
		require.NoError(t, s.Close())
	}
}

func TestNewLeavesPoolOpen(t *testing.T) {
	dsn := pgtest.DSN(t)
	ctx := testContext(t)
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	s, err := pgstore.New(ctx, pool, pgstore.WithSchema(pgtest.Schema(t, dsn)))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, pool.Ping(ctx), "the caller's pool stays open")
	assert.ErrorIs(t, s.Close(), idem.ErrClosed, "second Close")
}

// TestOpenUnreachable needs no server: nothing listens on the port.
func TestOpenUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := pgstore.Open(ctx, "postgres://idem@127.0.0.1:1/none?connect_timeout=5")
	require.Error(t, err)
	assert.True(t, errors.Is(err, idem.ErrJournalWrite), "got %v", err)
}
