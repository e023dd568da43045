package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/idemstore"
)

// Leases: who may send a pending operation (see the package
// documentation on the database's clock and incarnations).

// Acquire implements idemstore.KeyStore.
// An Acquire whose answer was lost returns an error matching
// idemstore.ErrOutcomeUnknown: the record may be pending under l now.
func (s *Store) Acquire(ctx context.Context, key string, l idemstore.Lease, req idemstore.Request) (idemstore.Operation, error) {
	ctx, cancel := s.bind(ctx, reserveTimeout)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return idemstore.Operation{}, err
	}
	h, err := encodeHeader(req.Header)
	if err != nil {
		return idemstore.Operation{}, fmt.Errorf("pgstore: acquire %s: header: %w", key, err)
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return idemstore.Operation{}, dbError("acquire", key, err)
	}
	var r row
	err = conn.QueryRow(ctx, s.q.acquire, key, l.Owner, nanos(l.Until), nanos(l.At), h, req.Body, nanos(l.At), s.incarnation, req.URL).Scan(r.dest()...)
	conn.Release()
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return idemstore.Operation{}, s.whyNot(ctx, "acquire", key, idemstore.ErrInProgress)
	case maybeSent(err):
		return idemstore.Operation{}, unknownError("acquire", key, err)
	case err != nil:
		return idemstore.Operation{}, dbError("acquire", key, err)
	}
	return r.operation()
}

// whyNot explains why a lease change matched no row: there is none
// (idemstore.ErrNotFound), or refused, naming the state or the holder.
func (s *Store) whyNot(ctx context.Context, what, key string, refused error) error {
	var state int16
	var owner, inc string
	var until int64
	err := s.pool.QueryRow(ctx, s.q.leaseOf, key).Scan(&state, &owner, &until, &inc)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("pgstore: %s %s: %w", what, key, idemstore.ErrNotFound)
	case err != nil:
		return dbError(what, key, err)
	case idemstore.State(state) != idemstore.StatePending:
		return fmt.Errorf("pgstore: %s %s: operation is %s: %w", what, key, idemstore.State(state), refused)
	}
	if owner == "" || inc != s.incarnation {
		inc = "another incarnation"
	} else {
		inc = "this store"
	}
	return fmt.Errorf("pgstore: %s %s: leased to %q (%s) until %s: %w", what, key, owner, inc, fromNanos(until).Format(time.RFC3339Nano), refused)
}

// renewBound bounds a Renew that releases a lease (l.Until at l.At), and
// is the least bound of one that extends it.
const renewBound = 5 * time.Second

// Renew implements idemstore.KeyStore. It gives up, with an error, within a
// third of the lease it asks for (and within renewBound of a release),
// so that a renewal that cannot be made never runs into the next one or
// past the lease, whatever ctx's deadline.
func (s *Store) Renew(ctx context.Context, key string, l idemstore.Lease) error {
	ctx, cancel := s.bind(ctx, max(l.Until.Sub(l.At)/3, renewBound))
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, s.q.renew, key, l.Owner, nanos(l.Until), s.incarnation, nanos(l.At))
	if err != nil {
		return dbError("renew", key, err)
	}
	if tag.RowsAffected() == 0 {
		return s.whyNot(ctx, "renew", key, idemstore.ErrLeaseLost)
	}
	return nil
}

// Claim implements idemstore.KeyStore. It is one statement: a select of the
// claimable rows FOR UPDATE SKIP LOCKED and an update of their lease.
// Rows of a newer format than this package reads are left alone, never
// leased, for the newer replicas that can send them (Pending still lists
// them as unreadable); a Claim that starts a walk (after "") logs how many
// there are, once each time that number changes.
func (s *Store) Claim(ctx context.Context, l idemstore.Lease, after string, limit int) ([]idemstore.Operation, error) {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	if after == "" {
		s.reportNewer(ctx)
	}
	ops, err := s.collect(ctx, "claim", s.q.claim, after, l.Owner, nanos(l.At), limitArg(limit), nanos(l.Until), s.incarnation, recordVersion)
	// UPDATE ... RETURNING returns rows in no particular order.
	slices.SortFunc(ops, func(a, b idemstore.Operation) int { return strings.Compare(a.Key, b.Key) })
	return ops, err
}

// reportNewer logs, once per change of their number, the pending rows of
// a newer format that Claim leaves to newer replicas.
func (s *Store) reportNewer(ctx context.Context) {
	var n int64
	if err := s.pool.QueryRow(ctx, s.q.newer, recordVersion).Scan(&n); err != nil {
		return // the claim that follows reports the database's error
	}
	if s.newer.Swap(n) != n && n > 0 {
		s.log.Warn("pgstore: pending operations of a newer record format are left to newer replicas",
			"count", n, "version", recordVersion)
	}
}

// ReleaseOwner ends the leases that owner holds in every incarnation but
// this Store's: those of a process of that name that is gone (a pod
// restarted under the same name). Their operations can then be resumed at
// once instead of when their leases lapse. Call it only when the
// application knows that process is dead: a process that still runs
// would send its calls while another replica resends them (with the same
// keys, so the provider answers one and replays or refuses the other). It
// returns how many leases it ended.
func (s *Store) ReleaseOwner(ctx context.Context, owner string) (int, error) {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, s.q.releaseOwner, owner, s.incarnation)
	if err != nil {
		return 0, dbError("release owner", owner, err)
	}
	return int(tag.RowsAffected()), nil
}
