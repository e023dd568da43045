package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/pgstore"
)

// The command works on a journal through idem.KeyStore and the optional
// capabilities of package idemstore, so that each command is written once for
// the bbolt file and the shared PostgreSQL journal:
//
//   - idem.Inspector lists every record (ls, gc --dry-run, stats) and finds
//     one by name (show, expire);
//   - idem.PolicyStore gives the application's policy, without which
//     resume and gc refuse to act;
//   - idem.Clock gives the shared journal's clock (the database's), by
//     which ages, leases and gc's cutoff are judged.
//
// The bbolt file adds salvage (idem.BoltStore.Salvage) for a damaged
// journal, and verify.

// errNoCapability is wrapped by the errors of commands the journal's store
// cannot serve.
var errNoCapability = errors.New("the journal's store cannot do this")

// shared reports whether the journal is a PostgreSQL database, shared by
// the application's replicas, rather than a bbolt file.
func (c *cli) shared() bool {
	return strings.HasPrefix(c.journal, "postgres://") || strings.HasPrefix(c.journal, "postgresql://")
}

// where names the journal in messages: the file, or the database without
// its password, with the schema.
func (c *cli) where() string {
	if !c.shared() {
		return c.journal
	}
	u, err := url.Parse(c.journal)
	if err != nil {
		return "the PostgreSQL journal (its URL does not parse)"
	}
	return fmt.Sprintf("%s (schema %s)", u.Redacted(), c.schema)
}

// open opens the journal, which must exist, for commands that change it
// (expire, gc, resume): the command never creates one.
func (c *cli) open() (idem.KeyStore, error) { return c.openStore(false, false) }

// openRead opens the journal for reading only, with Open's check of its
// records: for a bbolt file, read-only (idem.BoltOptions.ReadOnly), so
// that nothing is written to it, damaged or not. verify reads through it.
func (c *cli) openRead() (idem.KeyStore, error) { return c.openStore(false, true) }

// openSalvage opens the journal for reading what it can, damaged or not:
// for a bbolt file, read-only and without Open's check of its records
// (see idem.BoltOptions.SkipCheck). ls, pending, show and stats read
// through it, with BoltStore.Salvage.
func (c *cli) openSalvage() (idem.KeyStore, error) { return c.openStore(true, true) }

func (c *cli) openStore(salvage, readOnly bool) (idem.KeyStore, error) {
	var (
		s   idem.KeyStore
		err error
	)
	if c.shared() {
		s, err = c.openShared()
	} else {
		s, err = c.openBolt(salvage, readOnly)
	}
	if err != nil {
		return nil, err
	}
	if clock, ok := s.(idem.Clock); ok {
		now, err := clock.Now(c.ctx)
		if err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("reading the journal's clock: %w", err)
		}
		c.now = now
	}
	ps, ok := s.(idem.PolicyStore)
	if !ok {
		c.policy = withDefaults(idem.Policy{})
		return s, nil
	}
	c.hasPolicy = true
	p, err := ps.Policy(c.ctx)
	if err != nil {
		fmt.Fprintf(c.err, "idem: the journal's policy cannot be read (%v): using the defaults\n", err)
	}
	c.policy = withDefaults(p)
	return s, nil
}

func (c *cli) openBolt(salvage, readOnly bool) (idem.KeyStore, error) {
	if err := c.checkFile(); err != nil {
		return nil, err
	}
	return idem.OpenBoltStore(c.journal, &idem.BoltOptions{LockTimeout: c.lockTimeout, SkipCheck: salvage, ReadOnly: readOnly})
}

// connectTimeout bounds connecting to a shared journal and checking that
// its schema exists.
const connectTimeout = 15 * time.Second

// pgJournal is a shared journal: the store and the pool the command made
// for it.
type pgJournal struct {
	*pgstore.Store
	pool *pgxpool.Pool
}

// Close closes the store, then the pool.
func (p pgJournal) Close() error {
	err := p.Store.Close()
	p.pool.Close()
	return err
}

// openShared connects to the PostgreSQL journal. Like the bbolt file, it
// must exist: a schema without the journal's table is refused rather than
// created.
func (c *cli) openShared() (idem.KeyStore, error) {
	cfg, err := pgxpool.ParseConfig(c.journal)
	if err != nil {
		return nil, usageError(fmt.Sprintf("--journal: not a PostgreSQL URL: %v", redact(err, c.journal)))
	}
	cfg.MaxConns = 4
	ctx, cancel := context.WithTimeout(c.ctx, connectTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", c.where(), redact(err, c.journal))
	}
	var exists bool
	table := pgx.Identifier{c.schema, "operations"}.Sanitize()
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to %s: %w", c.where(), redact(err, c.journal))
	}
	if !exists {
		pool.Close()
		return nil, fmt.Errorf("no journal at %s: schema %q has no operations table (the command never creates one; is --schema right?)", c.where(), c.schema)
	}
	s, err := pgstore.New(ctx, pool, pgstore.WithSchema(c.schema))
	if err != nil {
		pool.Close()
		return nil, redact(err, c.journal)
	}
	return pgJournal{Store: s, pool: pool}, nil
}

// redact returns err with the password of dsn, should its text hold it,
// replaced.
func redact(err error, dsn string) error {
	u, perr := url.Parse(dsn)
	if perr != nil || err == nil {
		return err
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" || !strings.Contains(err.Error(), pw) {
		return err
	}
	return redactedError{err: err, text: strings.ReplaceAll(err.Error(), pw, "xxxxx")}
}

// redactedError is an error whose text had a password removed; it still
// matches what it wraps.
type redactedError struct {
	err  error
	text string
}

func (e redactedError) Error() string { return e.text }
func (e redactedError) Unwrap() error { return e.err }

// withDefaults completes a journal's policy with idem's defaults for what
// it does not say (a journal written before policies were journaled says
// nothing).
func withDefaults(p idem.Policy) idem.Policy {
	if p.KeyHeader == "" {
		p.KeyHeader = idem.DefaultHeader
	}
	if p.ResendWindow <= 0 {
		p.ResendWindow = idem.DefaultResendWindow
	}
	if p.Retention <= 0 {
		p.Retention = idem.DefaultRetention
	}
	p.Retention = max(p.Retention, p.RetentionFloor())
	return p
}

// needPolicy returns an error unless the journal keeps the application's
// policy: without it, what verb does could contradict the application's
// resend window and retention.
func (c *cli) needPolicy(verb string) error {
	if c.hasPolicy {
		return nil
	}
	return fmt.Errorf("%s: %w: the journal at %s does not keep the application's policy (its store is no idem.PolicyStore; a newer pgstore does): "+
		"without the application's resend window and retention the command cannot %s safely", verb, errNoCapability, c.where(), verb)
}

// checkFile checks that the journal is a non-empty regular file. An empty
// file would be taken for a new journal.
func (c *cli) checkFile() error {
	fi, err := os.Stat(c.journal)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("no journal at %s", c.journal)
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", c.journal)
	case fi.Size() == 0:
		return fmt.Errorf("%w: %s is empty (a journal is never empty: was it lost or truncated?)", idem.ErrJournalCorrupt, c.journal)
	}
	return nil
}

// closeStore closes s and joins its error to *err.
func closeStore(s idem.KeyStore, err *error) {
	if cerr := s.Close(); cerr != nil && !errors.Is(cerr, idem.ErrClosed) {
		*err = errors.Join(*err, cerr)
	}
}

// pendingPage is how many pending operations are read at a time.
const pendingPage = 500

// allPending reads every pending operation. Records the store could not
// read are returned with State 0 and LastError set, and err says so.
func allPending(ctx context.Context, s idem.KeyStore) ([]idem.Operation, error) {
	return allPages(ctx, s.Pending)
}

// allRecords reads every record of s that can be read, of any state,
// without bodies: unreadable records come with State 0 and LastError, and
// err names them (and, for a bbolt file, any damaged page: see
// idem.BoltStore.Salvage).
func allRecords(ctx context.Context, s idem.KeyStore) ([]idem.Operation, error) {
	switch s := s.(type) {
	case *idem.BoltStore:
		return s.Salvage(ctx)
	case idem.Inspector:
		return allPages(ctx, s.Walk)
	}
	return nil, fmt.Errorf("%w: listing finished operations needs an idem.Inspector", errNoCapability)
}

// salvagePending is allRecords' pending and unreadable records, for a
// bbolt file; for another store, allPending.
func salvagePending(ctx context.Context, s idem.KeyStore) ([]idem.Operation, error) {
	bs, ok := s.(*idem.BoltStore)
	if !ok {
		return allPending(ctx, s)
	}
	ops, err := bs.Salvage(ctx)
	out := ops[:0]
	for _, op := range ops {
		if op.State == idem.StatePending || op.State == 0 {
			out = append(out, op)
		}
	}
	return out, err
}

// allPages reads every page of a listing in key order.
func allPages(ctx context.Context, list func(ctx context.Context, after string, limit int) ([]idem.Operation, error)) ([]idem.Operation, error) {
	var (
		ops  []idem.Operation
		errs []error
	)
	for after := ""; ; {
		page, err := list(ctx, after, pendingPage)
		if err != nil {
			errs = append(errs, err)
		}
		ops = append(ops, page...)
		if len(page) < pendingPage {
			return ops, errors.Join(errs...)
		}
		after = page[len(page)-1].Key
	}
}

// find returns the operation with key or name arg. On a damaged bbolt
// journal it looks among what Salvage reads.
func find(ctx context.Context, s idem.KeyStore, arg string) (idem.Operation, error) {
	op, err := s.Get(ctx, arg)
	if err == nil {
		return op, nil
	}
	if bs, ok := s.(*idem.BoltStore); ok && errors.Is(err, idem.ErrJournalCorrupt) {
		ops, serr := bs.Salvage(ctx)
		for _, op := range ops {
			if op.Key == arg || op.Name == arg {
				if op.State == 0 {
					return op, fmt.Errorf("operation %s cannot be read: %s", cell(op.Key), op.LastError)
				}
				return op, nil
			}
		}
		return op, fmt.Errorf("no readable operation with key or name %s: %w", cell(arg), errors.Join(err, serr))
	}
	if !errors.Is(err, idem.ErrNotFound) && !errors.Is(err, idem.ErrInvalidKey) {
		return op, err
	}
	in, ok := s.(idem.Inspector)
	if !ok {
		return op, fmt.Errorf("no operation with key %q (%w: finding one by name needs an idem.Inspector)", arg, errNoCapability)
	}
	op, nerr := in.Named(ctx, arg)
	if errors.Is(nerr, idem.ErrNotFound) {
		return op, fmt.Errorf("no operation with key or name %q (finished operations are swept after their retention)", arg)
	}
	if nerr == nil && op.State == idem.StatePending {
		// An Inspector need not return the replayable request: Get does.
		if full, err := s.Get(ctx, op.Key); err == nil {
			op = full
		}
	}
	return op, nerr
}
