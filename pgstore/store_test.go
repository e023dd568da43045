package pgstore_test

import (
	"context"
	"errors"
	"slices"
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
	"github.com/idemgo/idem/storetest"
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

// allMigrations are the versions of the embedded migrations.
var allMigrations = []int{1, 2, 3, 4, 5, 30}

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
	assert.Equal(t, allMigrations, migrationVersions(t, ctx, s.Pool(), s.Schema()))
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
	assert.Equal(t, allMigrations, migrationVersions(t, ctx, stores[0].Pool(), schema))
}

func TestReopenKeepsSchema(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	ctx := testContext(t)
	for range 2 {
		s, err := pgstore.Open(ctx, dsn, pgstore.WithSchema(schema))
		require.NoError(t, err)
		assert.Equal(t, allMigrations, migrationVersions(t, ctx, s.Pool(), schema))
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

// TestMarksSurviveOutage finishes an operation while PostgreSQL is away:
// Finish accepts the change, reads fail closed meanwhile, and once the
// server is back the change is there, for this store's reads and, after
// Close, for every replica's.
func TestMarksSurviveOutage(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	p, viaProxy := newProxy(t, dsn)
	ctx := testContext(t)
	s, err := pgstore.Open(ctx, viaProxy, pgstore.WithSchema(schema))
	require.NoError(t, err)
	for _, k := range []string{"k1", "k2"} {
		_, _, err := s.Reserve(ctx, storetest.NewOperation(k))
		require.NoError(t, err)
	}

	p.Down()
	require.NoError(t, s.Finish(ctx, "k1", idem.Outcome{State: idem.StateSucceeded, Status: 201, Sent: 1}), "Finish while PostgreSQL is away")
	_, err = s.Get(ctx, "k1")
	require.ErrorIs(t, err, idem.ErrJournalWrite, "Get while PostgreSQL is away")
	_, _, err = s.Reserve(ctx, storetest.NewOperation("k3"))
	require.ErrorIs(t, err, idem.ErrJournalWrite, "Reserve while PostgreSQL is away")

	p.Up()
	var rec idem.Operation
	for try := 0; ; try++ { // each connection cut while idle fails once
		if rec, err = s.Get(ctx, "k1"); err == nil || try > int(s.Pool().Config().MaxConns)+1 {
			break
		}
	}
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State, "k1 after PostgreSQL came back")

	p.Down()
	require.NoError(t, s.Attempt(ctx, "k2", idem.Attempt{Sent: 1, Status: 503}), "Attempt while PostgreSQL is away")
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	p.Up()
	require.NoError(t, <-closed, "Close writes the accepted change once PostgreSQL is back")

	other, err := pgstore.Open(ctx, dsn, pgstore.WithSchema(schema))
	require.NoError(t, err)
	defer other.Close()
	rec, err = other.Get(ctx, "k2")
	require.NoError(t, err)
	assert.Equal(t, 1, rec.Attempts)
	assert.Equal(t, 503, rec.LastStatus)
	_, err = other.Get(ctx, "k3")
	assert.ErrorIs(t, err, idem.ErrNotFound, "the failed Reserve left no record")
}

// TestUnreadableRecords writes rows this version cannot read: one from a
// newer record format, one damaged. Get reports each with its sentinel;
// Pending returns them with only their key, and the errors joined, so
// that no pending operation is skipped in silence; Claim so returns the
// damaged one.
func TestUnreadableRecords(t *testing.T) {
	s := openStore(t)
	ctx := testContext(t)
	for _, k := range []string{"a-ok", "b-newer", "c-damaged"} {
		_, _, err := s.Reserve(ctx, storetest.NewOperation(k))
		require.NoError(t, err)
	}
	ops := pgx.Identifier{s.Schema(), "operations"}.Sanitize()
	_, err := s.Pool().Exec(ctx, `UPDATE `+ops+` SET version = 2 WHERE key = 'b-newer'`)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `UPDATE `+ops+` SET header = '{not json' WHERE key = 'c-damaged'`)
	require.NoError(t, err)

	_, err = s.Get(ctx, "b-newer")
	assert.ErrorIs(t, err, idem.ErrRecordVersion)
	_, err = s.Get(ctx, "c-damaged")
	assert.ErrorIs(t, err, idem.ErrJournalCorrupt)

	got, err := s.Pending(ctx, "", 0)
	assert.ErrorIs(t, err, idem.ErrRecordVersion)
	assert.ErrorIs(t, err, idem.ErrJournalCorrupt)
	require.Len(t, got, 3)
	assert.Equal(t, idem.StatePending, got[0].State)
	for i, key := range []string{"b-newer", "c-damaged"} {
		assert.Equal(t, key, got[i+1].Key)
		assert.Zero(t, got[i+1].State)
		assert.NotEmpty(t, got[i+1].LastError, "why %s cannot be read", key)
		assert.Nil(t, got[i+1].Body)
	}

	// Claim leaves the newer record to newer replicas (see
	// TestNewerFormatLeftAlone) and reports the damaged one.
	got, err = s.Claim(ctx, idem.Lease{Owner: "owner-a", At: time.Now(), Until: time.Now().Add(time.Minute)}, "", 0)
	assert.NotErrorIs(t, err, idem.ErrRecordVersion)
	assert.ErrorIs(t, err, idem.ErrJournalCorrupt)
	require.Len(t, got, 2)
	assert.Equal(t, "a-ok", got[0].Key)
	assert.Equal(t, "c-damaged", got[1].Key)
	assert.Zero(t, got[1].State)
	assert.NotEmpty(t, got[1].LastError)
}

func TestLastChange(t *testing.T) {
	s := openStore(t)
	ctx := testContext(t)
	last, err := s.LastChange(ctx)
	require.NoError(t, err)
	assert.True(t, last.IsZero(), "an empty journal: %v", last)

	before := time.Now()
	for _, k := range []string{"k1", "k2"} {
		op := storetest.NewOperation(k)
		op.Created, op.Updated = before, before
		_, _, err := s.Reserve(ctx, op)
		require.NoError(t, err)
	}
	k2, err := s.Get(ctx, "k2")
	require.NoError(t, err)
	last, err = s.LastChange(ctx)
	require.NoError(t, err)
	assert.True(t, last.Equal(k2.Updated) && !last.Before(before), "last change %v, k2 updated %v", last, k2.Updated)

	require.NoError(t, s.Finish(ctx, "k1", idem.Outcome{State: idem.StateSucceeded, Status: 201, Sent: 1, At: before.Add(time.Second)}))
	k1, err := s.Get(ctx, "k1")
	require.NoError(t, err)
	last, err = s.LastChange(ctx)
	require.NoError(t, err)
	assert.True(t, last.Equal(k1.Updated), "last change %v, k1 finished %v", last, k1.Updated)
}

// TestMigrateFillsGaps opens a schema whose migrations table records a
// later version but lacks earlier ones (a line of work merged out of
// order): Open applies each missing migration, not only those above the
// latest.
func TestMigrateFillsGaps(t *testing.T) {
	s := openStore(t)
	ctx := testContext(t)
	table := pgx.Identifier{s.Schema(), "migrations"}.Sanitize()
	ops := pgx.Identifier{s.Schema(), "operations"}.Sanitize()
	_, err := s.Pool().Exec(ctx, `DELETE FROM `+table+` WHERE version = 4;
		ALTER TABLE `+ops+` DROP COLUMN key_header;
		DROP TABLE `+pgx.Identifier{s.Schema(), "policy"}.Sanitize()+`;
		INSERT INTO `+table+` (version, name) VALUES (99, '0099_later.sql')`)
	require.NoError(t, err)
	again, err := pgstore.Open(ctx, pgtest.DSN(t), pgstore.WithSchema(s.Schema()))
	require.NoError(t, err)
	defer again.Close()
	assert.Equal(t, append(slices.Clone(allMigrations), 99), migrationVersions(t, ctx, s.Pool(), s.Schema()))
	_, _, err = again.Reserve(ctx, storetest.NewOperation("k1"))
	require.NoError(t, err, "the store works on the filled schema")
}
