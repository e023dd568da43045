// Package pgstore keeps idem's state on PostgreSQL, shared by every replica
// of a fleet: Store is an idemstore.KeyStore (the client's journal of outbound
// operations), and ServerStore is an idemserver.Store (the inbound keys of
// idempotent handlers, so that a retry that lands on another replica is
// replayed, and the records of event consumers: ServerStore.Once and
// ServerStore.Advance). Both live in one schema and may share one pool.
//
//	store, err := pgstore.Open(ctx, "postgres://idem@db:5432/shop")
//	if err != nil {
//		return err
//	}
//	client := idem.New(store)
//	defer client.Close() // closes the store too
//
// and on the server side, in front of handlers:
//
//	keys, err := pgstore.OpenServerStore(ctx, "postgres://idem@db:5432/shop?connect_timeout=5")
//	if err != nil {
//		return err
//	}
//	defer keys.Close()
//	mw := idemserver.New(keys, idemserver.WithPrincipal(accountID)) // the account your auth found
//	mux.Handle("POST /orders", mw.Required(createOrder))
//
// A named operation (idem.WithOperation) is one key fleet-wide: the name
// column is unique, so a retry that lands on another replica re-drives the
// same key. Each pending operation carries an owner and a lease; Claim takes
// the pending operations no one holds, whose lease lapsed, or that this
// very Store holds, with FOR UPDATE SKIP LOCKED, so several replicas
// resuming at once never send one operation twice.
//
// Leases are judged by one clock, the database's: every lease change takes
// PostgreSQL's clock_timestamp() as its now and lasts Until − At from
// then, so a replica whose clock is off (or whose Client's offset to the
// database's clock, idemstore.Clock, is stale) neither takes a live lease nor
// misses a lapsed one. A lease is held by an owner name and the Store that
// took it (its incarnation, a random id per Open or New): a restarted
// process with the same owner name, or a second one while the first still
// runs, takes the first one's operations only once their leases lapsed,
// or at once after ReleaseOwner, when the application knows the old
// process is dead. Records of a newer format than this package reads are
// never claimed: they are left to newer replicas (a rolling deploy).
//
// Durability: Reserve, Acquire and Renew return after PostgreSQL committed
// their change, so with the server's default synchronous_commit=on a
// reservation is on disk before the transport sends anything. A Reserve is
// one statement (an insert that does nothing on a conflict, and a select of
// the row it conflicted with): one round trip and one commit. Reservations
// made at the same moment share them: one goroutine sends everything queued
// while its last group ran as one statement of several rows, one
// transaction (group commit, no timer; a lone call is a group of one, and
// runs the statement of one).
//
// Attempt and Finish marks are grouped the same way and committed
// ASYNCHRONOUSLY (synchronous_commit=off for their transaction only):
// PostgreSQL answers before its WAL is flushed, and the next synchronous
// commit — any replica's next reservation — or the WAL writer, within
// 3 × wal_writer_delay (600 ms by default), flushes it. A crash of the
// PostgreSQL server inside that window can lose a mark: the operation is
// then still pending, and Resume sends it again under its key, so the
// provider replays its answer. Attempt and Finish wait for their commit at
// most 2 seconds (or their context's deadline): if PostgreSQL has not
// taken the mark by then (a broken connection, the server away or
// stalled), it is accepted and held in this process's memory, and written
// in order, again and again, until PostgreSQL takes it. A crash of the
// replica in that time loses it, with the same consequence: the operation
// stays pending and is sent again under its key. Reads and changes of this
// store wait for the held marks first (within their context, failing at
// once while PostgreSQL does not take them), and Close makes every mark
// durable or returns an error matching idemstore.ErrJournalWrite. A mark
// PostgreSQL refuses for its content (SQLSTATE class 22 or 23) is written
// without its error text, or, refused again, dropped and logged
// (WithLogger); it never holds back the marks after it. Error texts are
// written as given: the journal passes them as valid UTF-8 without NUL
// bytes, at most 2 KiB (see idemstore.KeyStore).
//
// A journal row that another transaction holds locked (an operator's
// session, a long transaction, SELECT ... FOR UPDATE) slows only its own
// operation: marks wait for a row lock at most 250 ms, then the mark of
// that row, and every later mark of its operation, is set aside and
// written on its own, again until PostgreSQL takes it, while the marks of
// other operations, reservations and reads go on without waiting for it.
// Its caller returns nil (accepted) as above; the operation stays pending
// — in doubt — for every reader, this store included, until the mark is
// written: it is never reported finished by assumption, and once its
// lease lapses Resume may send it again under its key. A role's
// statement_timeout that cancels a mark is dealt with the same way.
//
// Failures (ServerStore's are stated on its type): every error from
// PostgreSQL — unreachable, restarted, terminated connections, a read that
// failed — matches idemstore.ErrJournalWrite and wraps pgx's error; one that
// refuses the role a privilege also matches ErrPermission. Reserve fails
// closed: the transport sends nothing, and the store works again as soon
// as the pool reaches the server. A Reserve whose statement went out and
// whose answer was lost (a connection cut after it was sent, a deadline
// that passed while PostgreSQL had it) is tried again on another
// connection, which finds the row if the lost try committed it; if no try
// answers, the error matches idemstore.ErrOutcomeUnknown, not
// idemstore.ErrJournalWrite: the key may be journaled, and the operation is in
// doubt. An Acquire whose answer was lost is not tried again: its error
// matches idemstore.ErrOutcomeUnknown at once. Every call runs under its
// context and at most 30 seconds, whatever the context's deadline (a
// Renew, a third of its lease; a Sweep, each chunk of rows it deletes),
// and Close returns within 15 seconds whatever the database does.
//
// PgBouncer and other poolers: everything the stores do is one
// transaction at a time (a statement, a batch, a request's transaction;
// migrations lock with a transaction-level advisory lock; no session
// state), so they work through PgBouncer in transaction pooling mode — but
// pgx's default query mode prepares named statements, which such a pooler
// (PgBouncer before 1.21, or with max_prepared_statements = 0) hands from
// one client to another. Put default_query_exec_mode=exec in the DSN
// (simple_protocol and cache_describe work too; describe_exec does not:
// its describe and its execute may reach different server connections).
// Open, New, OpenServerStore and NewServerStore find out: through such a
// pooler in the default mode they return an error matching ErrPooler that
// names the setting, instead of failing later, call by call.
//
// Schema: the store keeps its tables in their own PostgreSQL schema ("idem"
// unless WithSchema names another) and creates or migrates them on Open and
// New. Migrations are embedded in the package, versioned, and applied in
// one transaction under an advisory lock, so replicas that start at once
// migrate once. The role needs the CREATE privilege on the database the
// first time (or the schema must exist and belong to it), and again when a
// newer version of this package adds a migration; a schema migrated
// already opens with USAGE on the schema and SELECT, INSERT, UPDATE and
// DELETE on its tables. A privilege PostgreSQL refuses (SQLSTATE 42501) is
// an error matching ErrPermission, at Open as in every call.
package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/idemstore"
)

// DefaultSchema is the PostgreSQL schema the store's tables live in unless
// WithSchema names another.
const DefaultSchema = "idem"

// Option configures a Store or a ServerStore.
type Option func(*config)

type config struct {
	schema string
	log    *slog.Logger
	events map[string]time.Duration // WithEventRetention, by scope
}

// WithLogger sets the logger of what the store deals with on its own: a
// mark PostgreSQL refused, repaired or dropped. Nil, the default, logs
// nothing. It applies to a Store only: a ServerStore has nothing to log
// on its own (every failure is returned to the middleware, which reports
// it), and ignores it.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.log = l }
}

// WithSchema keeps the store's tables in the PostgreSQL schema name instead
// of DefaultSchema; it is created if missing. Stores with different schemas
// share nothing, which lets tests run side by side on one database.
func WithSchema(name string) Option {
	return func(c *config) { c.schema = name }
}

// Store is an idemstore.KeyStore on PostgreSQL. It is safe for concurrent use by
// many goroutines and by many processes sharing one database.
type Store struct {
	pool    *pgxpool.Pool
	ownPool bool // Open made the pool, so Close closes it
	schema  string
	q       queries
	// incarnation names this Store in the leases it holds (see
	// migrations/0003), and reserveIDs numbers its reservations.
	incarnation string
	reserveIDs  atomic.Int64
	newer       atomic.Int64 // newer-format pending rows last reported
	log         *slog.Logger
	marks       *markWriter
	reserver    *reserver
	// base is the context of every statement (see bind), cancelled when
	// Close gives up on PostgreSQL.
	base   context.Context
	cancel context.CancelFunc

	closed atomic.Bool
}

// Open connects to the database at dsn (a PostgreSQL URL or key=value
// string, as pgxpool.ParseConfig takes), creates or migrates the store's
// schema, and returns the Store. Close closes the connection pool.
func Open(ctx context.Context, dsn string, opts ...Option) (*Store, error) {
	pool, err := connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	s, err := New(ctx, pool, opts...)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownPool = true
	return s, nil
}

// New returns a Store on an existing pool, after creating or migrating its
// schema. Close leaves the pool open: it belongs to the caller.
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	c, err := configure(opts)
	if err != nil {
		return nil, err
	}
	if err := migrate(ctx, pool, c.schema, idemstore.ErrJournalWrite); err != nil {
		return nil, err
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	q := newQueries(c.schema)
	base, cancel := context.WithCancel(context.Background())
	s := &Store{pool: pool, schema: c.schema, q: q, log: c.log, base: base, cancel: cancel, incarnation: uuid.NewString(),
		marks: newMarkWriter(pool, base, c.log, q.present)}
	s.reserver = newReserver(s)
	return s, nil
}

// connect makes the pool of Open and OpenServerStore: dsn is a
// PostgreSQL URL or key=value string, as pgxpool.ParseConfig takes; an
// unreachable database gives an error matching idemstore.ErrJournalWrite.
func connect(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: connect: %w: %w", idemstore.ErrJournalWrite, err)
	}
	return pool, nil
}

// configure applies the options of New and NewServerStore.
func configure(opts []Option) (config, error) {
	c := config{schema: DefaultSchema}
	for _, o := range opts {
		o(&c)
	}
	if c.schema == "" {
		return config{}, errors.New("pgstore: empty schema name")
	}
	return c, nil
}

// closeTimeout bounds Close.
const closeTimeout = 15 * time.Second

// Close makes every accepted change durable, releases the store, and
// closes the pool if Open made it. It returns within 15 seconds whatever
// PostgreSQL does: if PostgreSQL has not taken the changes by then, Close
// cancels every statement of the store still running and returns an error
// matching idemstore.ErrJournalWrite: those changes may be lost. Later calls
// of every method, Close included, return an error matching
// idemstore.ErrClosed.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("pgstore: close: %w", idemstore.ErrClosed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	// Writing gets two thirds of the bound, closing connections the rest.
	wctx, wcancel := context.WithTimeout(ctx, closeTimeout*2/3)
	defer wcancel()
	s.reserver.close(wctx)
	err := s.marks.drain(wctx)
	if err != nil {
		err = fmt.Errorf("pgstore: close: %w", err)
	} else if err = retry(wctx, s.barrier); err != nil {
		err = fmt.Errorf("pgstore: close: flushing asynchronous commits: %w: %w", idemstore.ErrJournalWrite, err)
	}
	s.cancel() // ends every statement still running, so their connections return to the pool
	s.marks.close()
	s.reserver.wait()
	if s.ownPool {
		// pgx may hold a connection a little longer (a ping it started
		// runs to its own deadline): the pool finishes closing in the
		// background if it must.
		closed := make(chan struct{})
		go func() {
			s.pool.Close()
			close(closed)
		}()
		select {
		case <-closed:
		case <-ctx.Done():
		}
	}
	return err
}

// retry calls fn until it succeeds or ctx ends, waiting a growing delay
// between calls, and returns its last error. A connection the server
// closed while idle in the pool fails once and is dropped, so a few tries
// get past a server restart.
func retry(ctx context.Context, fn func(context.Context) error) error {
	delay := markRetryMin
	for {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if !sleep(ctx, delay) {
			return err
		}
		delay = min(2*delay, markRetryMax)
	}
}

// barrier returns once every change committed asynchronously is on disk:
// it commits a transaction synchronously, which flushes the WAL before it.
func (s *Store) barrier(ctx context.Context) error {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	_, err := s.pool.Exec(ctx, s.q.barrier)
	return err
}

// Pool returns the connection pool the store uses.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Schema returns the PostgreSQL schema that holds the store's tables.
func (s *Store) Schema() string { return s.schema }

//go:embed migrations/*.sql
var migrationFS embed.FS

// migration is one embedded schema change, numbered by its file name
// ("0001_operations.sql" is version 1).
type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations in version order. Versions
// are unique and positive; they may have gaps (ranges reserved for lines
// of work that land in any order), since a schema records each version
// it applied, not only the latest.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("pgstore: migration file %q has no version prefix", e.Name())
		}
		b, err := fs.ReadFile(migrationFS, "migrations/"+e.Name())
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: e.Name(), sql: string(b)})
	}
	slices.SortFunc(ms, func(a, b migration) int { return a.version - b.version })
	for i, m := range ms {
		if m.version < 1 || i > 0 && m.version == ms[i-1].version {
			return nil, fmt.Errorf("pgstore: migration %s: version %d is not positive or not unique", m.name, m.version)
		}
	}
	return ms, nil
}

// missing returns the migrations of ms whose versions applied does not
// hold, in version order.
func missing(ms []migration, applied map[int]bool) []migration {
	var out []migration
	for _, m := range ms {
		if !applied[m.version] {
			out = append(out, m)
		}
	}
	return out
}

// querier is what appliedVersions needs of a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// appliedVersions returns the versions recorded in table.
func appliedVersions(ctx context.Context, q querier, table string) (map[int]bool, error) {
	rows, err := q.Query(ctx, `SELECT version FROM `+table)
	if err != nil {
		return nil, err
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	applied := make(map[int]bool, len(vs))
	for _, v := range vs {
		applied[int(v)] = true
	}
	return applied, err
}

// migrateLockClass is the first half of the advisory lock key that
// serializes migrations; the second half is a hash of the schema name.
const migrateLockClass = 0x1de4 // "idem"

// migrate creates the schema and applies the migrations it lacks (each
// embedded version not recorded in its migrations table), in one
// transaction that first takes a transaction-level advisory lock: replicas
// that start at once wait for each other, and the later ones find the work
// done. A schema migrated by a newer version of this package (versions
// this one does not embed) is used as it is; migrations only add. A
// schema that lacks none of them is opened without a write. Every
// migration runs whichever store opens the schema, so the client's Store
// and the ServerStore always find all their tables. Errors match sentinel,
// the calling store's error for a database it cannot write.
func migrate(ctx context.Context, pool *pgxpool.Pool, schema string, sentinel error) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	if err := probePooler(ctx, pool); err != nil {
		return err
	}
	fail := func(step string, err error) error {
		if pooler(err) {
			return fmt.Errorf("pgstore: migrate schema %q: %s: %w (%s): %w", schema, step, ErrPooler, poolerHint, err)
		}
		if sqlState(err) == "42501" {
			return fmt.Errorf("pgstore: migrate schema %q: %s: %w (the first Open needs a role that may create the schema "+
				"and its tables; later ones need USAGE on the schema and SELECT, INSERT, UPDATE, DELETE on its tables): %w",
				schema, step, ErrPermission, err)
		}
		return fmt.Errorf("pgstore: migrate schema %q: %s: %w: %w", schema, step, sentinel, err)
	}
	// A schema migrated already needs nothing but reads: a role with only
	// the privileges to use it opens it.
	if applied, err := migratedVersions(ctx, pool, schema); err != nil {
		return fail("read version", err)
	} else if len(missing(ms, applied)) == 0 {
		return nil
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, migrateLockClass, schema); err != nil {
			return fail("lock", err)
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
			return fail("look up schema", err)
		}
		ident := pgx.Identifier{schema}.Sanitize()
		if !exists {
			if _, err := tx.Exec(ctx, `CREATE SCHEMA `+ident); err != nil {
				return fail("create schema", err)
			}
		}
		// Unqualified names in the migrations mean the store's schema.
		if _, err := tx.Exec(ctx, `SET LOCAL search_path TO `+ident); err != nil {
			return fail("search_path", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS migrations (
			version integer PRIMARY KEY,
			name    text NOT NULL,
			applied timestamptz NOT NULL DEFAULT now()
		)`); err != nil {
			return fail("create migrations table", err)
		}
		applied, err := appliedVersions(ctx, tx, "migrations")
		if err != nil {
			return fail("read version", err)
		}
		for _, m := range missing(ms, applied) {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return fail(m.name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO migrations (version, name) VALUES ($1, $2)`, m.version, m.name); err != nil {
				return fail(m.name, err)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, sentinel) && !errors.Is(err, ErrPermission) {
		return fail("commit", err) // the begin or the commit failed
	}
	return err
}

// probePooler finds out, when pool prepares and caches named statements
// (pgx's default query mode), whether a connection pooler in front of
// PostgreSQL mixes them up between connections, as PgBouncer in
// transaction pooling mode does: two connections of the pool, held at
// once, run one statement in turn. Straight to PostgreSQL they are two
// sessions, each with its own statement; through such a pooler the second
// lands on the server connection the first just prepared it on and
// PostgreSQL answers 42P05 (or, on another one, 26000 to the first when it
// runs it again). The error then matches ErrPooler and says what to put
// in the DSN. A pool of one connection is not probed (it cannot hold two),
// nor is one in another query mode.
func probePooler(ctx context.Context, pool *pgxpool.Pool) error {
	cfg := pool.Config()
	if cfg.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement || cfg.MaxConns < 2 {
		return nil
	}
	var conns [2]*pgxpool.Conn
	for i := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			for _, c := range conns[:i] {
				c.Release()
			}
			return fmt.Errorf("pgstore: connect: %w: %w", idemstore.ErrJournalWrite, err)
		}
		conns[i] = c
	}
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	const probe = `SELECT $1::int -- pgstore: prepared statements through a pooler`
	for _, c := range []*pgxpool.Conn{conns[0], conns[1], conns[0]} {
		var n int
		if err := c.QueryRow(ctx, probe, 1).Scan(&n); err != nil {
			if pooler(err) {
				return fmt.Errorf("pgstore: open: %w (%s): %w", ErrPooler, poolerHint, err)
			}
			return fmt.Errorf("pgstore: open: %w: %w", idemstore.ErrJournalWrite, err)
		}
	}
	return nil
}

// migratedVersions returns the migrations applied to schema, none when
// the schema or its migrations table does not exist.
func migratedVersions(ctx context.Context, pool *pgxpool.Pool, schema string) (map[int]bool, error) {
	table := pgx.Identifier{schema, "migrations"}.Sanitize()
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
		return nil, err
	}
	return appliedVersions(ctx, pool, table)
}
