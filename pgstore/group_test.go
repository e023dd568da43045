package pgstore_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
	"github.com/idemgo/idem/storetest"
)

// manyTracer records the statements of several rows (reserveMany,
// finishMany: those that unnest arrays) and how many rows each took.
type manyTracer struct {
	mu   sync.Mutex
	rows []int // per statement, the length of its first array
}

func (m *manyTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	m.saw(d.SQL, d.Args)
	return ctx
}
func (m *manyTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (m *manyTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (m *manyTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	m.saw(d.SQL, d.Args)
}
func (m *manyTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (m *manyTracer) saw(sql string, args []any) {
	if !strings.Contains(sql, "unnest(") || len(args) == 0 {
		return
	}
	keys, _ := args[0].([]string)
	m.mu.Lock()
	m.rows = append(m.rows, len(keys))
	m.mu.Unlock()
}

func (m *manyTracer) statements() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]int(nil), m.rows...)
}

// onePool opens a Store whose pool has one connection, traced, so that a
// test holding that connection makes the store's calls queue up and then
// go as one group.
func onePool(t *testing.T) (*pgstore.Store, *pgxpool.Pool, *manyTracer) {
	return onePoolMode(t, "")
}

// onePoolMode is onePool with pgx's query mode (default_query_exec_mode;
// "" for pgx's default, prepared and cached statements).
func onePoolMode(t *testing.T, mode string) (*pgstore.Store, *pgxpool.Pool, *manyTracer) {
	t.Helper()
	ctx := testContext(t)
	dsn := pgtest.DSN(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if mode != "" {
		cfg, err = pgxpool.ParseConfig(withParam(dsn, "default_query_exec_mode="+mode))
	}
	require.NoError(t, err)
	cfg.MaxConns = 1
	tr := &manyTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := pgstore.New(ctx, pool, pgstore.WithSchema(pgtest.Schema(t, dsn)))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s, pool, tr
}

// eventually waits until cond holds, or fails t after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReserveGroupOneStatement queues reservations while the store's only
// connection is held, so that they go as one statement, and checks each
// gets the answer it would get alone: new ones created and read back
// whole, one whose name or key is taken given the record that has it,
// and two with the same name in the group: one created, the other given
// the first's record.
func TestReserveGroupOneStatement(t *testing.T) {
	for _, mode := range queryModes {
		t.Run("mode="+cmp.Or(mode, "default"), func(t *testing.T) { testReserveGroup(t, mode) })
	}
}

// queryModes are pgx's query modes the statements of several rows are
// tested in: its default (prepared, cached), and those a DSN through a
// pooler in transaction mode names (see ErrPooler), which send the
// arrays unprepared, as text in simple_protocol.
var queryModes = []string{"", "exec", "simple_protocol"}

func testReserveGroup(t *testing.T, mode string) {
	s, pool, tr := onePoolMode(t, mode)
	ctx := testContext(t)
	taken := storetest.NewOperation("taken-key")
	taken.Name = "taken-name"
	_, created, err := s.Reserve(ctx, taken)
	require.NoError(t, err)
	require.True(t, created)

	type call struct {
		op      idemstore.Operation
		rec     idemstore.Operation
		created bool
		err     error
	}
	var calls []*call
	add := func(key, name string) *call {
		op := storetest.NewOperation(key)
		op.Name, op.Trace, op.KeyHeader = name, "00-trace-"+key, "Idempotency-Key"
		op.History = []idemstore.Attempt{{Sent: 1, Status: 503, At: op.Created, Owner: op.Owner}}
		c := &call{op: op}
		calls = append(calls, c)
		return c
	}
	var fresh []*call
	for i := range 6 {
		fresh = append(fresh, add(fmt.Sprintf("new-%d", i), ""))
	}
	named := add("named-1", "order-1")
	byName := add("other-key", "taken-name")
	byKey := add("taken-key", "")
	dupA, dupB := add("dup-a", "order-2"), add("dup-b", "order-2")

	held, err := pool.Acquire(ctx)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Go(func() { c.rec, c.created, c.err = s.Reserve(ctx, c.op) })
	}
	eventually(t, "the reservations queue", func() bool { return pgstore.ReserveQueued(s) == len(calls) })
	held.Release()
	wg.Wait()

	// The first group (which waited for the connection) took one or
	// more, the second the rest: all but one went in statements of
	// several.
	var rows int
	for _, n := range tr.statements() {
		rows += n
	}
	require.GreaterOrEqual(t, rows, len(calls)-1, "reservations written by statements of several (rows per statement: %v)", tr.statements())

	for _, c := range append(fresh, named) {
		require.NoError(t, c.err, c.op.Key)
		assert.True(t, c.created, c.op.Key)
		got, err := s.Get(ctx, c.op.Key)
		require.NoError(t, err)
		assert.Equal(t, c.op.Name, got.Name, c.op.Key)
		assert.Equal(t, c.op.Body, got.Body, c.op.Key)
		assert.Equal(t, c.op.Header, got.Header, c.op.Key)
		assert.Equal(t, c.op.Fingerprint, got.Fingerprint, c.op.Key)
		assert.Equal(t, c.op.URL, got.URL, c.op.Key)
		assert.Equal(t, c.op.Trace, got.Trace, c.op.Key)
		assert.Equal(t, c.op.KeyHeader, got.KeyHeader, c.op.Key)
		assert.Equal(t, c.op.Owner, got.Owner, c.op.Key)
		assert.Len(t, got.History, 1, c.op.Key)
		assert.True(t, got.LeaseUntil.After(time.Now().Add(50*time.Minute)), "%s: lease as long from now as from Updated: %v", c.op.Key, got.LeaseUntil)
	}
	for _, c := range []*call{byName, byKey} {
		require.NoError(t, c.err, c.op.Key)
		assert.False(t, c.created, c.op.Key)
		assert.Equal(t, taken.Key, c.rec.Key, "%s: the record that has its name or key", c.op.Key)
	}
	require.NoError(t, dupA.err)
	require.NoError(t, dupB.err)
	assert.NotEqual(t, dupA.created, dupB.created, "one of two reservations of one name is created")
	first, second := dupA, dupB
	if dupB.created {
		first, second = dupB, dupA
	}
	assert.Equal(t, first.op.Key, second.rec.Key, "the other is given the created one's record")
	_, err = s.Get(ctx, second.op.Key)
	assert.True(t, errors.Is(err, idemstore.ErrNotFound), "no row for the reservation that lost its name: %v", err)
}

// TestFinishGroupOneStatement queues marks while the store's only
// connection is held, so that the finishes of distinct keys go as one
// statement, and checks each mark did what it does alone: in order with
// its operation's attempt, a key with no record answered ErrNotFound, a
// mark whose owner lost the row changing nothing, a second finish of a
// key written after the first.
func TestFinishGroupOneStatement(t *testing.T) {
	for _, mode := range queryModes {
		t.Run("mode="+cmp.Or(mode, "default"), func(t *testing.T) { testFinishGroup(t, mode) })
	}
}

func testFinishGroup(t *testing.T, mode string) {
	s, pool, tr := onePoolMode(t, mode)
	ctx := testContext(t)
	var keys []string
	for i := range 6 {
		op := storetest.NewOperation(fmt.Sprintf("op-%d", i))
		_, created, err := s.Reserve(ctx, op)
		require.NoError(t, err)
		require.True(t, created)
		keys = append(keys, op.Key)
	}
	at := time.Now().Truncate(time.Microsecond)
	type mark struct {
		key string
		run func() error
		err error
	}
	finish := func(key, owner string, status int) *mark {
		return &mark{key: key, run: func() error {
			return s.Finish(ctx, key, idemstore.Outcome{State: idemstore.StateSucceeded, Status: status, Sent: 1, URL: "https://api.example.com/v1/charges/" + key, At: at, Owner: owner})
		}}
	}
	owner := storetest.NewOperation("x").Owner
	marks := []*mark{
		{key: keys[0], run: func() error {
			return s.Attempt(ctx, keys[0], idemstore.Attempt{Sent: 2, Status: 503, At: at, Owner: owner})
		}},
		finish(keys[0], owner, 201),
		finish(keys[1], owner, 201),
		finish(keys[2], owner, 202),
		finish(keys[3], "someone-else", 201), // its owner does not hold the row
		finish("no-such-key", owner, 201),
		finish(keys[4], "", 201),
		finish(keys[4], "", 209), // the same key again: after the first
		finish(keys[5], owner, 201),
	}
	held, err := pool.Acquire(ctx)
	require.NoError(t, err)
	// Queue in order: each mark is queued before the next is made.
	var wg sync.WaitGroup
	for i, m := range marks {
		wg.Go(func() { m.err = m.run() })
		eventually(t, "the marks queue", func() bool { return pgstore.MarksQueued(s) == i+1 })
	}
	held.Release()
	wg.Wait()

	var most int
	for _, n := range tr.statements() {
		most = max(most, n)
	}
	require.GreaterOrEqual(t, most, 4, "one statement wrote the finishes of distinct keys (rows per statement: %v)", tr.statements())

	for _, m := range marks {
		if m.key == "no-such-key" {
			assert.True(t, errors.Is(m.err, idemstore.ErrNotFound), "a mark for a key with no record: %v", m.err)
			continue
		}
		assert.NoError(t, m.err, m.key)
	}
	get := func(key string) idemstore.Operation {
		op, err := s.Get(ctx, key)
		require.NoError(t, err)
		return op
	}
	op := get(keys[0])
	assert.Equal(t, idemstore.StateSucceeded, op.State)
	assert.Equal(t, 3, op.Attempts, "the attempt's 2 and the finish's 1")
	assert.Equal(t, 201, op.LastStatus)
	assert.Nil(t, op.Body, "the replayable request goes")
	assert.Equal(t, "https://api.example.com/v1/charges/"+keys[0], op.URL)
	assert.True(t, op.LeaseUntil.IsZero())
	assert.Equal(t, at, op.Updated)
	assert.Equal(t, 202, get(keys[2]).LastStatus)
	assert.Equal(t, idemstore.StatePending, get(keys[3]).State, "a finish by an owner that does not hold the row changes nothing")
	assert.Equal(t, 209, get(keys[4]).LastStatus, "the later finish of a key is written after the earlier")
	assert.Equal(t, 2, get(keys[4]).Attempts)
	for _, k := range []string{keys[1], keys[5]} {
		assert.Equal(t, idemstore.StateSucceeded, get(k).State, k)
	}
}

// TestGroupsKeepIndexPlans checks that the statements of several rows
// find their rows by index on a table that grew after their plans were
// made. PostgreSQL keeps a prepared statement's plan per connection; one
// made while the table was nearly empty joins the rows to a sequential
// scan of the table, and keeps doing so as it grows. The test makes the
// store's one connection plan its groups on a small table, grows the
// table by 20,000 rows behind it, and counts the sequential scans of
// the table (pg_stat_user_tables) while the same connection writes more
// groups: none.
func TestGroupsKeepIndexPlans(t *testing.T) {
	s, pool, _ := onePool(t)
	ctx := testContext(t)
	n := 0
	// group reserves four operations as one group, then finishes them as
	// one group, and a reservation of a taken key (which reads the
	// table) with them.
	group := func() {
		t.Helper()
		var ops []idemstore.Operation
		for range 4 {
			n++
			ops = append(ops, storetest.NewOperation(fmt.Sprintf("op-%d", n)))
		}
		if n > 4 {
			ops = append(ops, storetest.NewOperation("op-1")) // taken
		}
		held, err := pool.Acquire(ctx)
		require.NoError(t, err)
		var wg sync.WaitGroup
		for _, op := range ops {
			wg.Go(func() {
				_, _, err := s.Reserve(ctx, op)
				assert.NoError(t, err)
			})
		}
		eventually(t, "the reservations queue", func() bool { return pgstore.ReserveQueued(s) == len(ops) })
		held.Release()
		wg.Wait()
		held, err = pool.Acquire(ctx)
		require.NoError(t, err)
		for i, op := range ops[:4] {
			wg.Go(func() {
				assert.NoError(t, s.Finish(ctx, op.Key, idemstore.Outcome{State: idemstore.StateSucceeded, Status: 201, Sent: 1, URL: op.URL, At: time.Now(), Owner: op.Owner}))
			})
			eventually(t, "the marks queue", func() bool { return pgstore.MarksQueued(s) == i+1 })
		}
		held.Release()
		wg.Wait()
	}
	for range 8 { // past PostgreSQL's five custom plans: the kept plan is made
		group()
	}
	ops := pgx.Identifier{s.Schema(), "operations"}.Sanitize()
	admin, err := pgx.Connect(ctx, pgtest.DSN(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `INSERT INTO `+ops+` (key, version, method, url, host, fingerprint, state, attempts, last_status, last_error, created, updated, owner, lease_until, redacted, unreplayable)
		SELECT 'old-' || g, 1, 'POST', 'u', 'h', '\x00', 2, 1, 201, '', g, g, '', 0, false, false FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	// seqScans flushes the statistics of the store's connection and reads
	// the table's count of sequential scans.
	seqScans := func() int64 {
		t.Helper()
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		conn.Release()
		require.NoError(t, err)
		var scans int64
		eventually(t, "the statistics flush", func() bool {
			err := admin.QueryRow(ctx, `SELECT pg_stat_clear_snapshot()::text || '', coalesce((SELECT seq_scan FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'operations'), -1)`, s.Schema()).Scan(new(string), &scans)
			require.NoError(t, err)
			return scans >= 0
		})
		time.Sleep(1100 * time.Millisecond) // the backend flushes at most once a second
		require.NoError(t, admin.QueryRow(ctx, `SELECT pg_stat_clear_snapshot()::text || '', seq_scan FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'operations'`, s.Schema()).Scan(new(string), &scans))
		return scans
	}
	before := seqScans()
	for range 3 {
		group()
	}
	after := seqScans()
	assert.Equal(t, before, after, "sequential scans of the journal table by the store's groups, once it grew")
}
