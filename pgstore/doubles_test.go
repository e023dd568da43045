package pgstore_test

// Test doubles around a Store, so that the store's production code has no
// test-only mode: a database clock the test sets, and a Client whose times
// are off.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// clockedStore is a Store whose database clock reads what the test says:
// its connections find the schema's own clock_timestamp() before
// PostgreSQL's (search_path), and every lease change first sets that clock
// to the time its caller passes (Lease.At, a reservation's Updated). So
// the store runs its production SQL, which judges leases by the database's
// clock, under the synthetic times of the conformance suite.
type clockedStore struct {
	*pgstore.Store
	pool  *pgxpool.Pool
	setAt string // the statement that sets the clock
}

// openClocked opens a clockedStore on schema, creating the schema and its
// clock first if they do not exist. It and its pool are closed when t
// ends.
func openClocked(t *testing.T, schema string) *clockedStore {
	t.Helper()
	ctx := testContext(t)
	dsn := pgtest.DSN(t)
	s := pgx.Identifier{schema}.Sanitize()
	clock := pgx.Identifier{schema, "test_clock"}.Sanitize()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+s+`;
		CREATE TABLE IF NOT EXISTS `+clock+` (t timestamptz NOT NULL);
		INSERT INTO `+clock+` SELECT pg_catalog.clock_timestamp() WHERE NOT EXISTS (SELECT 1 FROM `+clock+`);
		CREATE OR REPLACE FUNCTION `+pgx.Identifier{schema, "clock_timestamp"}.Sanitize()+`() RETURNS timestamptz
			LANGUAGE sql STABLE AS 'SELECT t FROM `+clock+`'`)
	conn.Close(ctx)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	// pg_catalog named after the schema: the schema's clock_timestamp
	// comes first (unnamed, pg_catalog would be searched first).
	cfg.ConnConfig.RuntimeParams["search_path"] = schema + ",pg_catalog"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := pgstore.New(ctx, pool, pgstore.WithSchema(schema))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() }) // before the pool's
	return &clockedStore{Store: st, pool: pool, setAt: `UPDATE ` + clock + ` SET t = $1`}
}

// set sets the database clock to at (nothing for the zero time).
func (c *clockedStore) set(ctx context.Context, at time.Time) error {
	if at.IsZero() {
		return nil
	}
	_, err := c.pool.Exec(ctx, c.setAt, at)
	return err
}

func (c *clockedStore) Reserve(ctx context.Context, op idemstore.Operation) (idemstore.Operation, bool, error) {
	if err := c.set(ctx, op.Updated); err != nil {
		return idemstore.Operation{}, false, err
	}
	return c.Store.Reserve(ctx, op)
}

func (c *clockedStore) Acquire(ctx context.Context, key string, l idemstore.Lease, req idemstore.Request) (idemstore.Operation, error) {
	if err := c.set(ctx, l.At); err != nil {
		return idemstore.Operation{}, err
	}
	return c.Store.Acquire(ctx, key, l, req)
}

func (c *clockedStore) Renew(ctx context.Context, key string, l idemstore.Lease) error {
	if err := c.set(ctx, l.At); err != nil {
		return err
	}
	return c.Store.Renew(ctx, key, l)
}

func (c *clockedStore) Claim(ctx context.Context, l idemstore.Lease, after string, limit int) ([]idemstore.Operation, error) {
	if err := c.set(ctx, l.At); err != nil {
		return nil, err
	}
	return c.Store.Claim(ctx, l, after, limit)
}

// skewedStore is a Store under a Client whose clock is d off and whose
// offset to the database's clock is wrong: it moves every time its caller
// passes (Created, Updated, LeaseUntil, a lease's At and Until) by d.
type skewedStore struct {
	*pgstore.Store
	d time.Duration
}

func (s *skewedStore) lease(l idemstore.Lease) idemstore.Lease {
	l.At, l.Until = l.At.Add(s.d), l.Until.Add(s.d)
	return l
}

func (s *skewedStore) Reserve(ctx context.Context, op idemstore.Operation) (idemstore.Operation, bool, error) {
	op.Created, op.Updated = op.Created.Add(s.d), op.Updated.Add(s.d)
	if !op.LeaseUntil.IsZero() {
		op.LeaseUntil = op.LeaseUntil.Add(s.d)
	}
	return s.Store.Reserve(ctx, op)
}

func (s *skewedStore) Acquire(ctx context.Context, key string, l idemstore.Lease, req idemstore.Request) (idemstore.Operation, error) {
	return s.Store.Acquire(ctx, key, s.lease(l), req)
}

func (s *skewedStore) Renew(ctx context.Context, key string, l idemstore.Lease) error {
	return s.Store.Renew(ctx, key, s.lease(l))
}

func (s *skewedStore) Claim(ctx context.Context, l idemstore.Lease, after string, limit int) ([]idemstore.Operation, error) {
	return s.Store.Claim(ctx, s.lease(l), after, limit)
}
