package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/idemstore"
)

var (
	_ idemstore.Clock       = (*Store)(nil)
	_ idemstore.PolicyStore = (*Store)(nil)
)

// Now implements idemstore.Clock: it returns the database's clock
// (clock_timestamp(), to the microsecond), the one clock every replica's
// leases are judged by. A Client measures its offset to it, so the times
// it passes to the store (Lease.At and Until, Created, Updated, Sweep's
// cutoff) are the database's time whatever its own clock says.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	if err := s.check(ctx); err != nil {
		return time.Time{}, err
	}
	var us int64
	if err := s.pool.QueryRow(ctx, s.q.now).Scan(&us); err != nil {
		return time.Time{}, dbError("now", "", err)
	}
	return time.UnixMicro(us), nil
}

// Policy implements idemstore.PolicyStore.
func (s *Store) Policy(ctx context.Context) (idemstore.Policy, error) {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	if err := s.check(ctx); err != nil {
		return idemstore.Policy{}, err
	}
	var p idemstore.Policy
	var resend, retention, match int64
	err := s.pool.QueryRow(ctx, s.q.policy).Scan(&p.KeyHeader, &resend, &retention, &match)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return idemstore.Policy{}, nil
	case err != nil:
		return idemstore.Policy{}, dbError("policy", "", err)
	}
	p.ResendWindow, p.Retention, p.MatchWindow = time.Duration(resend), time.Duration(retention), time.Duration(match)
	return p, nil
}

// SetPolicy implements idemstore.PolicyStore. It returns once PostgreSQL
// committed the policy.
func (s *Store) SetPolicy(ctx context.Context, p idemstore.Policy) error {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	if err := s.check(ctx); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, s.q.setPolicy, p.KeyHeader, int64(p.ResendWindow), int64(p.Retention), int64(p.MatchWindow)); err != nil {
		return dbError("set policy", "", err)
	}
	return nil
}
