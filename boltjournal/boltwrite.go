package boltjournal

// The bbolt journal's writes: the KeyStore methods that change records,
// each a change committed by the group commit (boltstore.go).

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/codec"
	bolt "go.etcd.io/bbolt"
)

// Reserve implements KeyStore. It returns once the new record is durable.
func (s *Store) Reserve(ctx context.Context, op idemstore.Operation) (idemstore.Operation, bool, error) {
	if err := s.check(ctx); err != nil {
		return idemstore.Operation{}, false, err
	}
	if op.Key == "" || isBodyKey([]byte(op.Key)) {
		// What the format cannot hold: bbolt has no empty key, and a key
		// ending in NUL names a body stored apart. The journal's keys are
		// visible ASCII (CheckKey).
		return idemstore.Operation{}, false, fmt.Errorf("reserve %q: %w: the bbolt journal cannot hold an empty key or one ending in NUL", op.Key, idemstore.ErrInvalidKey)
	}
	s.seen(op.Owner)
	rv := reservations.Get().(*reservation)
	defer rv.recycle()
	rv.op, rv.sc = op, &s.scratch
	rec := toRecord(&rv.op)
	if len(op.Body) >= bodyApart {
		rec.Body, rec.Flags = nil, rec.Flags|flagBodyApart
		rv.bodyKey = bodyKey(op.Key)
	}
	rv.key, rv.val = encodeKV(rv.small[:0], op.Key, &rec)
	if err := s.write(ctx, rv.fn); err != nil {
		return idemstore.Operation{}, false, fmt.Errorf("reserve %s: %w", op.Key, err)
	}
	if !rv.created {
		if rv.existing.State == idemstore.StatePending {
			s.setLive(rv.existing.Key)
		}
		return rv.existing, false, nil
	}
	if op.State == idemstore.StatePending {
		s.setLive(op.Key)
	}
	// op.Header and op.Body are shared with the caller, as Reserve's
	// contract allows; times are rounded as the journal keeps them.
	op.Created, op.Updated = fromNanos(rec.Created), fromNanos(rec.Updated)
	return op, true, nil
}

// reservation is one Reserve's change and its result, with room for the
// encoded record if it is small (bbolt holds the value until the commit,
// which Reserve waits for). Reservations are reused: once write returns,
// the change has run and committed, or will never run (groupcommit's Do
// drops a change whose context ended while it was queued), so nothing
// refers to one any more.
type reservation struct {
	fn       func(*bolt.Tx) error // run, made once per reservation
	op       idemstore.Operation
	sc       *txScratch
	key, val []byte // the encoded record, in one buffer
	bodyKey  []byte // where op.Body goes if it is stored apart
	existing idemstore.Operation
	created  bool
	small    [reservationBuf]byte
}

// reservationBuf is the room a reservation has for its key and record: a
// record with a few headers and a body of a few hundred bytes.
const reservationBuf = 512

var reservations = sync.Pool{New: func() any {
	rv := new(reservation)
	rv.fn = rv.run
	return rv
}}

// recycle clears the reservation, so that it holds on to no request, and
// puts it back for another Reserve.
func (rv *reservation) recycle() {
	rv.op, rv.existing = idemstore.Operation{}, idemstore.Operation{}
	rv.sc, rv.key, rv.val, rv.bodyKey, rv.created = nil, nil, nil, nil, false
	reservations.Put(rv)
}

func (rv *reservation) run(tx *bolt.Tx) error {
	rv.created = false
	ops, err := opsOf(tx)
	if err != nil {
		return err
	}
	var names *bolt.Bucket
	if rv.op.Name != "" {
		if names, err = namesOf(tx); err != nil {
			return err
		}
		if k := names.Get([]byte(rv.op.Name)); k != nil {
			rv.existing, err = loadOp(ops, string(k))
			if errors.Is(err, idemstore.ErrNotFound) {
				err = fmt.Errorf("%w: name %q points to missing record %s", idemstore.ErrJournalCorrupt, rv.op.Name, k)
			}
			return err
		}
	}
	rv.sc.begin(tx, ops)
	if rv.sc.get(rv.key) != nil {
		rv.existing, err = loadOp(ops, rv.op.Key)
		return err
	}
	if err := ops.Put(rv.key, rv.val); err != nil {
		return err
	}
	if rv.bodyKey != nil {
		if err := ops.Put(rv.bodyKey, rv.op.Body); err != nil {
			return err
		}
	}
	if names != nil {
		if err := names.Put([]byte(rv.op.Name), rv.key); err != nil {
			return err
		}
	}
	rv.created = true
	return nil
}

// seen records owner as a lease owner of this session.
func (s *Store) seen(owner string) {
	if owner == "" {
		return
	}
	if _, ok := s.owners.Load(owner); !ok {
		s.owners.LoadOrStore(owner, struct{}{})
	}
}

// heldByOther is Lease.BlockedBy, with leases of owners not seen since
// the file was opened lapsed.
func (s *Store) heldByOther(l idemstore.Lease, owner string, until int64) bool {
	if !l.BlockedBy(owner, fromNanos(until)) {
		return false
	}
	_, live := s.owners.Load(owner)
	return live
}

// Acquire implements KeyStore. It returns once the change is durable.
func (s *Store) Acquire(ctx context.Context, key string, l idemstore.Lease, rq idemstore.Request) (idemstore.Operation, error) {
	if err := s.check(ctx); err != nil {
		return idemstore.Operation{}, err
	}
	s.seen(l.Owner)
	now := toNanos(l.At)
	var op idemstore.Operation
	err := s.write(ctx, func(tx *bolt.Tx) error {
		ops, err := opsOf(tx)
		if err != nil {
			return err
		}
		apart := false // the new body goes apart
		err = s.change(ops, key, func(r *codec.Record, req []byte) ([]byte, error) {
			pending := idemstore.State(r.State) == idemstore.StatePending
			if pending && s.heldByOther(l, r.Owner, r.LeaseUntil) {
				return nil, fmt.Errorf("leased to %q: %w", r.Owner, idemstore.ErrInProgress)
			}
			r.Owner, r.LeaseUntil, r.Updated = l.Owner, toNanos(l.Until), now
			if !pending {
				r.State, r.URL = uint8(idemstore.StatePending), rq.URL
				if apart = len(rq.Body) >= bodyApart; apart {
					r.Flags |= flagBodyApart
					req = codec.AppendRequest(nil, rq.Header, nil)
				} else {
					req = codec.AppendRequest(nil, rq.Header, rq.Body)
				}
			}
			return req, nil
		})
		if err != nil {
			return err
		}
		if apart {
			if err := ops.Put(bodyKey(key), rq.Body); err != nil {
				return err
			}
		}
		op, err = loadOp(ops, key)
		return err
	})
	if err != nil {
		return idemstore.Operation{}, fmt.Errorf("acquire %q: %w", key, err)
	}
	s.setLive(key)
	return op, nil
}

// Renew implements KeyStore. It returns once the change is durable.
func (s *Store) Renew(ctx context.Context, key string, l idemstore.Lease) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	err := s.write(ctx, func(tx *bolt.Tx) error {
		ops, err := opsOf(tx)
		if err != nil {
			return err
		}
		return s.change(ops, key, func(r *codec.Record, req []byte) ([]byte, error) {
			if idemstore.State(r.State) != idemstore.StatePending || r.Owner != l.Owner {
				return nil, idemstore.ErrLeaseLost
			}
			r.LeaseUntil = toNanos(l.Until)
			return req, nil
		})
	})
	if err != nil {
		return fmt.Errorf("renew %q: %w", key, err)
	}
	return nil
}

// Attempt implements KeyStore. The change is queued for the next commit;
// Attempt returns an error at once only if the record does not exist or
// cannot be read. When the commit finds the record finished or held by
// another owner than a.Owner, the mark changes nothing (KeyStore.Attempt);
// so for Finish.
func (s *Store) Attempt(ctx context.Context, key string, a idemstore.Attempt) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if err := s.known(key, false); err != nil {
		return fmt.Errorf("attempt: %w", err)
	}
	now := toNanos(a.At)
	err := s.writeAsync(func(tx *bolt.Tx) error {
		ops, err := opsOf(tx)
		if err != nil {
			return err
		}
		err = s.change(ops, key, func(r *codec.Record, req []byte) ([]byte, error) {
			if !heldBy(r, a.Owner) {
				return req, errUnchanged // its owner lost the record
			}
			r.Attempts += int64(a.Sent)
			r.LastStatus, r.LastError = int64(a.Status), a.Err
			r.Updated = now
			appendHistory(r, a)
			return req, nil
		})
		if err != nil {
			return fmt.Errorf("attempt: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("attempt %q: %w", key, err)
	}
	return nil
}

// Finish implements KeyStore. The change, which also drops the stored
// request, is queued for the next commit; Finish returns an error at once
// only if the record does not exist or cannot be read.
func (s *Store) Finish(ctx context.Context, key string, o idemstore.Outcome) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if err := s.known(key, true); err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	err := s.writeAsync(newFinishMark(s, key, o).fn)
	if err != nil {
		return fmt.Errorf("finish %q: %w", key, err)
	}
	return nil
}

// known returns nil if the record for key exists with a version this code
// can rewrite, so that Attempt and Finish report ErrNotFound and
// ErrRecordVersion at once. A key this store reserved, acquired or claimed
// and has not finished is known without a read; any other is looked up.
// With finish, a live key stops being live.
func (s *Store) known(key string, finish bool) error {
	if s.takeLive(key, finish) {
		return nil
	}
	return s.f.View(func(tx *bolt.Tx) error {
		ops, err := opsOf(tx)
		if err != nil {
			return err
		}
		v := ops.Get([]byte(key))
		if v == nil {
			return fmt.Errorf("%q: %w", key, idemstore.ErrNotFound)
		}
		if _, err := codec.Check(v); err != nil {
			return codecErr(key, err)
		}
		return nil
	})
}
