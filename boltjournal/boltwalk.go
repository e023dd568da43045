// The bbolt journal's walks over its records: Pending, Walk, Claim and
// Sweep.

package boltjournal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/codec"
	bolt "go.etcd.io/bbolt"
)

// Pending implements KeyStore. It walks the records in key order from
// after.
func (s *Store) Pending(ctx context.Context, after string, limit int) ([]idemstore.Operation, error) {
	return s.list(ctx, after, limit, true)
}

// Walk implements Inspector: it returns up to limit records of any state
// with keys after after ("" starts at the first), in key order, without
// their requests: for tools that list or count what the journal holds. It
// changes nothing. A record that cannot be read is returned as Pending
// returns one.
func (s *Store) Walk(ctx context.Context, after string, limit int) ([]idemstore.Operation, error) {
	return s.list(ctx, after, limit, false)
}

// list is Pending (pendingOnly) and Walk.
func (s *Store) list(ctx context.Context, after string, limit int, pendingOnly bool) ([]idemstore.Operation, error) {
	if err := s.settle(ctx); err != nil {
		return nil, err
	}
	var (
		out  []idemstore.Operation
		errs []error
	)
	err := s.f.View(func(tx *bolt.Tx) error {
		out, errs = nil, nil
		return walk(tx, after, pendingOnly, func(op idemstore.Operation, err error) bool {
			if err != nil {
				errs = append(errs, err)
			}
			out = append(out, op)
			return limit <= 0 || len(out) < limit
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	return out, errors.Join(errs...)
}

// Claim implements KeyStore. It returns once the leases are durable. It
// looks for candidates in a read transaction, so that walking the journal
// does not hold up the writer, and then leases, in one commit, those that
// are still pending and free.
func (s *Store) Claim(ctx context.Context, l idemstore.Lease, after string, limit int) ([]idemstore.Operation, error) {
	if err := s.settle(ctx); err != nil {
		return nil, err
	}
	s.seen(l.Owner)
	for {
		var cands []string
		full := false
		err := s.f.View(func(tx *bolt.Tx) error {
			cands, full = cands[:0], false
			return walkPending(tx, after, func(op idemstore.Operation, err error) bool {
				if err != nil || !s.heldByOther(l, op.Owner, toNanos(op.LeaseUntil)) {
					cands = append(cands, op.Key)
				}
				full = limit > 0 && len(cands) >= limit
				return !full
			})
		})
		if err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
		if len(cands) == 0 {
			return nil, nil
		}
		out, err := s.lease(ctx, l, cands)
		if err != nil || len(out) > 0 || !full {
			return out, err
		}
		// Every candidate was taken meanwhile; look further.
		after = cands[len(cands)-1]
	}
}

// lease leases to l.Owner, in one commit, each record of keys that is still
// pending and free at l.At, and returns those with the records it cannot
// read (Key only, errors joined).
func (s *Store) lease(ctx context.Context, l idemstore.Lease, keys []string) ([]idemstore.Operation, error) {
	var (
		out  []idemstore.Operation
		errs []error
	)
	err := s.write(ctx, func(tx *bolt.Tx) error {
		out, errs = nil, nil
		ops, err := opsOf(tx)
		if err != nil {
			return err
		}
		for _, key := range keys {
			op, err := loadOp(ops, key)
			switch {
			case errors.Is(err, idemstore.ErrNotFound):
				continue
			case err != nil:
				err = fmt.Errorf("pending %w", err)
				errs = append(errs, err)
				out = append(out, idemstore.Operation{Key: key, LastError: err.Error()})
				continue
			case op.State != idemstore.StatePending || s.heldByOther(l, op.Owner, toNanos(op.LeaseUntil)):
				continue
			}
			op.Owner, op.LeaseUntil = l.Owner, l.Until
			err = s.change(ops, key, func(r *codec.Record, req []byte) ([]byte, error) {
				r.Owner, r.LeaseUntil = l.Owner, toNanos(l.Until)
				return req, nil
			})
			if err != nil {
				return err
			}
			out = append(out, op)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	for _, op := range out {
		if op.State == idemstore.StatePending {
			s.setLive(op.Key)
		}
	}
	return out, errors.Join(errs...)
}

// walkPending calls fn for each pending record after after, in key order,
// until fn returns false. A record it cannot read is passed with only its
// key and the error: it may be a pending one.
func walkPending(tx *bolt.Tx, after string, fn func(idemstore.Operation, error) bool) error {
	return walk(tx, after, true, fn)
}

// walk calls fn for the records after after, in key order, until fn returns
// false: the pending ones with their requests, or (pendingOnly false)
// every record without its request. A record it cannot read is passed with
// only its key, LastError and the error.
func walk(tx *bolt.Tx, after string, pendingOnly bool, fn func(idemstore.Operation, error) bool) error {
	ops, err := opsOf(tx)
	if err != nil {
		return err
	}
	c := ops.Cursor()
	k, v := c.Seek([]byte(after))
	if after != "" && string(k) == after {
		k, v = c.Next()
	}
	for ; k != nil; k, v = c.Next() {
		if isBodyKey(k) {
			continue
		}
		state, err := codec.Check(v)
		if err == nil && pendingOnly && idemstore.State(state) != idemstore.StatePending {
			continue
		}
		key := string(k)
		var r codec.Record
		if err == nil {
			err = codec.Decode(v, &r)
		}
		if err != nil {
			err = codecErr(key, err)
		}
		var op idemstore.Operation
		if err == nil {
			op = fromRecord(key, &r)
			if pendingOnly {
				err = loadBody(ops, &r, &op)
			} else {
				op.Header, op.Body = nil, nil
			}
		}
		if err != nil {
			err = fmt.Errorf("record %w", err)
			if !fn(idemstore.Operation{Key: key, LastError: err.Error()}, err) {
				return nil
			}
			continue
		}
		if !fn(op, nil) {
			return nil
		}
	}
	return nil
}

// sweepChunk caps the records one Sweep commit deletes.
const sweepChunk = 1000

// Sweep implements KeyStore. It walks the records in key order and deletes
// the finished ones last updated before cutoff, in commits of at most 1000
// records. Records it cannot read are kept.
func (s *Store) Sweep(ctx context.Context, cutoff time.Time) (int, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	total := 0
	limit := cutoff.UnixNano()
	var from []byte // where the next chunk starts
	for {
		n, more := 0, false
		err := s.write(ctx, func(tx *bolt.Tx) error {
			n, more = 0, false
			ops, err := opsOf(tx)
			if err != nil {
				return err
			}
			names, err := namesOf(tx)
			if err != nil {
				return err
			}
			type victim struct {
				key, name []byte
				apart     bool // its body is stored apart
			}
			var doomed []victim
			var r codec.Record
			c := ops.Cursor()
			k, v := c.First()
			if from != nil {
				k, v = c.Seek(from)
			}
			next := from
			for ; k != nil; k, v = c.Next() {
				if len(doomed) == sweepChunk {
					more = true
					break
				}
				next = k
				if isBodyKey(k) {
					continue
				}
				// One decode checks the record and reads its head; r aliases
				// v, which stays valid until the deletes below.
				if _, err := codec.DecodeHeadAlias(v, &r); err != nil {
					s.log.Warn("idem: sweep kept unreadable record", "key", string(k), "err", codecErr(string(k), err))
					continue
				}
				if !idemstore.State(r.State).Finished() || r.Updated >= limit {
					continue
				}
				doomed = append(doomed, victim{bytes.Clone(k), []byte(r.Name), r.Flags&flagBodyApart != 0})
			}
			if more {
				from = append(bytes.Clone(next), 0)
			}
			for _, d := range doomed {
				if err := ops.Delete(d.key); err != nil {
					return err
				}
				if d.apart { // a record reserved finished with a large body
					if err := ops.Delete(bodyKey(string(d.key))); err != nil {
						return err
					}
				}
				if len(d.name) > 0 && bytes.Equal(names.Get(d.name), d.key) {
					if err := names.Delete(d.name); err != nil {
						return err
					}
				}
				n++
			}
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("sweep: %w", err)
		}
		total += n
		if !more {
			return total, nil
		}
	}
}
