package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/idemserver"
)

// DefaultEventRetention is how long ServerStore.Once and ServerStore.Advance
// keep a record unless WithEventRetention says otherwise: longer than any
// broker's redelivery window (SQS keeps a message 4 days at most, Stripe
// retries a webhook for 3 days, Kafka's default retention is 7 days).
const DefaultEventRetention = 7 * 24 * time.Hour

// ErrInvalidEvent is returned, wrapped, by Once and Advance for an empty
// scope, event id or entity, one longer than MaxEventNameBytes, or one
// that is not valid UTF-8 or holds a NUL byte (PostgreSQL's text cannot),
// and for a nil transaction.
var ErrInvalidEvent = errors.New("pgstore: invalid event")

// MaxEventNameBytes is the longest scope, event id or entity Once and
// Advance take, as idem.WithOperation's names: short enough for one index
// entry.
const MaxEventNameBytes = 1024

// WithEventRetention sets how long ServerStore.Once and ServerStore.Advance
// keep the records of scope: an event id is a duplicate for d after its
// first delivery, and an entity's version refuses older ones for d after
// its last advance. Scope "" sets the retention of every scope not named
// (DefaultEventRetention unless set). A d of zero or less keeps the
// default. Choose d longer than the longest time the sender may deliver an
// event again (its redelivery window plus a consumer's downtime): a
// delivery after the record expired runs again, and an older version
// arriving after it expired is applied. Stores that share a schema should
// agree on it; each applies its own to the records it writes. The Store
// (client side) ignores this option.
func WithEventRetention(scope string, d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			return
		}
		if c.events == nil {
			c.events = map[string]time.Duration{}
		}
		c.events[scope] = d
	}
}

// eventRetention returns the retention of scope's records.
func (s *ServerStore) eventRetention(scope string) time.Duration {
	if d, ok := s.events[scope]; ok {
		return d
	}
	if d, ok := s.events[""]; ok {
		return d
	}
	return DefaultEventRetention
}

// eventQueries are Once's and Advance's statements and their sweeps.
type eventQueries struct {
	once, advance, sweepIDs, sweepVersions string
}

func newEventQueries(schema string) eventQueries {
	ids := pgx.Identifier{schema, "event_ids"}.Sanitize()
	versions := pgx.Identifier{schema, "entity_versions"}.Sanitize()
	sweep := func(t, key string) string {
		return `DELETE FROM ` + t + ` WHERE (` + key + `) IN (
			SELECT ` + key + ` FROM ` + t + ` WHERE expires <= ` + serverNow("$1") + ` ORDER BY expires LIMIT ` + fmt.Sprint(sweepChunk) + `
			FOR UPDATE SKIP LOCKED)`
	}
	return eventQueries{
		// Once: $1 scope, $2 id, $3 caller's now or NULL, $4 retention in
		// ns. A live row makes the insert do nothing (no row affected); an
		// expired one is taken over as if absent. A row another
		// transaction inserted and has not committed makes this statement
		// wait for that transaction's end (the unique index), then decide
		// on what it committed.
		once: `INSERT INTO ` + ids + ` AS e (scope, id, expires) SELECT $1, $2, c.now + $4
			FROM (SELECT ` + serverNow("$3") + ` AS now) c
			ON CONFLICT (scope, id) DO UPDATE SET expires = excluded.expires
			WHERE e.expires <= excluded.expires - $4::bigint`,
		// Advance: $3 version, $4 caller's now or NULL, $5 retention in
		// ns. The row is replaced by a newer version, or by any version
		// once it expired; an equal or older one changes nothing.
		advance: `INSERT INTO ` + versions + ` AS v (scope, entity, version, expires) SELECT $1, $2, $3, c.now + $5
			FROM (SELECT ` + serverNow("$4") + ` AS now) c
			ON CONFLICT (scope, entity) DO UPDATE SET version = excluded.version, expires = excluded.expires
			WHERE v.version < excluded.version OR v.expires <= excluded.expires - $5::bigint`,
		sweepIDs:      sweep(ids, "scope, id"),
		sweepVersions: sweep(versions, "scope, entity"),
	}
}

// Once records the delivery of event id in scope in the caller's
// transaction tx and reports whether it is the first: true means the
// consumer should do its work in tx (and commit both), false that an
// earlier delivery committed its record and the consumer should skip the
// event (and still commit or roll back tx; it changed nothing).
//
//	tx, err := pool.Begin(ctx)
//	...
//	defer tx.Rollback(ctx)
//	first, err := keys.Once(ctx, tx, "payments", msg.ID)
//	if err != nil {
//		return err // nack: redelivered later
//	}
//	if first {
//		// the consumer's writes, in tx
//	}
//	return tx.Commit(ctx) // then ack
//
// The record and the consumer's writes commit together or not at all: a
// consumer that fails, rolls back or dies before its commit leaves no
// record, and the redelivery runs again; once the commit returned, every
// later delivery within the scope's retention (see WithEventRetention) gets
// false. tx may be any pgx.Tx on the store's database: one the consumer
// began, or pgstore.Tx's in a handler.
//
// Concurrent deliveries of one event in two transactions: the second
// Once waits (a row lock, within its context) until the first transaction
// ends, then returns false if it committed and true if it rolled back; so
// the work runs once. Under REPEATABLE READ or SERIALIZABLE isolation the
// second gets a serialization failure (SQLSTATE 40001) instead: roll back
// and deliver again. An event that expired but was not swept yet counts
// as new.
//
// Cost: one statement in tx, one index entry; the row stays locked until
// tx ends. Errors from PostgreSQL match idemstore.ErrJournalWrite and leave tx
// aborted (roll it back); an invalid scope or id, ErrInvalidEvent.
func (s *ServerStore) Once(ctx context.Context, tx pgx.Tx, scope, id string) (first bool, err error) {
	what := "once " + scope + "/" + id
	if err := s.eventCheck(ctx, tx, what, scope, id); err != nil {
		return false, err
	}
	tag, err := tx.Exec(ctx, s.eq.once, scope, id, s.eventNow(), int64(s.eventRetention(scope)))
	if err != nil {
		return false, s.fail(ctx, what, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Advance records version as the newest applied to entity in scope, in
// the caller's transaction tx, if it is newer than the one recorded, and
// reports whether it did: true means the consumer applies the event in tx
// (and commits both); false means an equal or newer version was committed
// first, and the event is stale: the consumer skips it, so an older event
// that arrives late never overwrites a newer state. Versions are the
// sender's (a sequence number, an updated-at in Unix nanoseconds): any
// int64 that grows with the entity's state.
//
// As with Once, the record commits or rolls back with the consumer's
// writes, and two transactions advancing one entity at once are
// serialized: the second waits for the first to end, then compares with
// what it committed (READ COMMITTED; under REPEATABLE READ or SERIALIZABLE
// it gets a serialization failure to retry). The row stays locked until tx
// ends, so consumers of one entity run one at a time.
//
// A record expires the scope's retention after its last advance (see
// WithEventRetention); after that, any version is applied. Errors are
// Once's.
func (s *ServerStore) Advance(ctx context.Context, tx pgx.Tx, scope, entity string, version int64) (applied bool, err error) {
	what := fmt.Sprintf("advance %s/%s to %d", scope, entity, version)
	if err := s.eventCheck(ctx, tx, what, scope, entity); err != nil {
		return false, err
	}
	tag, err := tx.Exec(ctx, s.eq.advance, scope, entity, version, s.eventNow(), int64(s.eventRetention(scope)))
	if err != nil {
		return false, s.fail(ctx, what, err)
	}
	return tag.RowsAffected() == 1, nil
}

// RequestAdvancer returns the idemserver.Advancer of Webhook routes ordered
// with idemserver.WithOrder: its Advance is s.Advance in the transaction of
// the request being served (Tx), so the version and the handler's writes
// commit with the stored answer. Outside a request that holds a key of s
// it returns an error matching ErrInvalidEvent.
func (s *ServerStore) RequestAdvancer() idemserver.Advancer { return requestAdvancer{s} }

type requestAdvancer struct{ s *ServerStore }

// Advance implements idemserver.Advancer.
func (a requestAdvancer) Advance(ctx context.Context, scope, entity string, version int64) (bool, error) {
	tx := Tx(ctx)
	if tx == nil {
		return false, fmt.Errorf("pgstore: advance %s/%s: %w: no request transaction in the context (the route must be behind idemserver's middleware on this ServerStore)", scope, entity, ErrInvalidEvent)
	}
	return a.s.Advance(ctx, tx, scope, entity, version)
}

// eventCheck returns an error for a call of Once or Advance that cannot
// run: a done context, a closed store, a nil transaction or bad names.
func (s *ServerStore) eventCheck(ctx context.Context, tx pgx.Tx, what, scope, name string) error {
	if err := s.check(ctx); err != nil {
		return fmt.Errorf("pgstore: %s: %w", what, err)
	}
	if tx == nil {
		return fmt.Errorf("pgstore: %s: %w: nil transaction", what, ErrInvalidEvent)
	}
	for _, v := range [...]string{scope, name} {
		if v == "" || len(v) > MaxEventNameBytes || !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("pgstore: %s: %w: a scope, id or entity is 1 to %d bytes of UTF-8 without NUL", what, ErrInvalidEvent, MaxEventNameBytes)
		}
	}
	return nil
}

// eventNow returns the time Once and Advance judge expiry by: nil for the
// database's clock, unless a test set a clock (SetEventClock).
func (s *ServerStore) eventNow() *int64 {
	if s.eventClock == nil {
		return nil
	}
	n := nanos(s.eventClock())
	return &n
}
