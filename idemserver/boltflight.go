package idemserver

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem/idemstore"
)

// flights are a BoltStore's keys in flight, kept in memory: only one
// process can open the file, so no other process needs to see them, and a
// crash that loses them leaves no handler of theirs running. Beside them,
// under the same lock, is the index of the stored keys.
type flights struct {
	mu     sync.Mutex
	tokens uint64 // the last token given; under mu, like everything here
	m      map[string]*flight
	// idx is the index of stored keys (see keyIndex), changed after
	// commits only.
	idx keyIndex
}

// lookup returns the expiry of a record of id in the index (the first,
// if the index holds several for id's hash); f.mu must be held.
func (f *flights) lookup(id string) (uint64, bool) {
	var buf [1]uint64
	es := f.idx.expiries(idHash(id), buf[:0])
	if len(es) == 0 {
		return 0, false
	}
	return es[0], true
}

// indexed returns how many records the index holds; f.mu must be held.
func (f *flights) indexed() int { return f.idx.n }

// index records that a record of id, expiring at exp, entered the index;
// f.mu must be held.
func (f *flights) index(id string, exp uint64) { f.idx.add(idHash(id), exp) }

// unindex records that the record of id expiring at exp left the file;
// f.mu must be held.
func (f *flights) unindex(id string, exp uint64) { f.idx.remove(idHash(id), exp) }

// forget takes the records of the keys gone (records bucket keys) out of
// the index.
func (f *flights) forget(gone [][]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range gone {
		if len(k) < 8 {
			continue
		}
		h, exp := idHash(string(k[8:])), binary.BigEndian.Uint64(k)
		if !f.idx.remove(h, exp) {
			f.idx.sweptUnindexed(h, exp)
		}
	}
	f.idx.shrink()
}

// flight is one key in flight.
type flight struct {
	fingerprint, token string
	expires            time.Time
	completing         bool // Complete is committing its record: not to be taken over
	held               bool // a running request holds it whatever its lease says (BeginHeld)
}

// lapsed reports whether fl's lease counts and ended at or before now.
func (fl *flight) lapsed(now time.Time) bool {
	return !fl.held && !fl.expires.After(now)
}

// live returns the flight of id that holds it at now, if any (a
// completing one whatever its lease); f.mu must be held.
func (f *flights) live(id string, now time.Time) *flight {
	fl := f.m[id]
	if fl == nil || (!fl.completing && fl.lapsed(now)) {
		return nil
	}
	return fl
}

// held returns the flight of id held under token, not completing, with a
// lease live at now (or held); f.mu must be held.
func (f *flights) held(id, token string, now time.Time) (*flight, error) {
	fl := f.m[id]
	if fl == nil || fl.completing || fl.token != token || fl.lapsed(now) {
		return nil, fmt.Errorf("key %s: %w", id, ErrLockLost)
	}
	return fl, nil
}

// sweep deletes the flights whose lease lapsed at or before now and
// returns how many.
func (f *flights) sweep(now time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for id, fl := range f.m {
		if !fl.completing && fl.lapsed(now) {
			delete(f.m, id)
			n++
		}
	}
	return n
}

// Begin implements Store. A new key is claimed in memory, without a
// commit; a done key is answered from a read-only transaction.
func (s *BoltStore) Begin(ctx context.Context, b Begin) (Claim, error) {
	return s.begin(b, false)
}

// BeginHeld implements LocalStore: Begin, with the key held while its
// request runs.
func (s *BoltStore) BeginHeld(ctx context.Context, b Begin) (Claim, error) {
	return s.begin(b, true)
}

// Unhold implements LocalStore; it changes memory only.
func (s *BoltStore) Unhold(id, token string) {
	f := &s.flights
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[id]; fl != nil && fl.token == token {
		fl.held = false
	}
}

func (s *BoltStore) begin(b Begin, held bool) (Claim, error) {
	if s.closed.Load() {
		return Claim{}, ErrClosed
	}
	f := &s.flights
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.live(b.ID, b.Now); fl != nil {
		if fl.fingerprint != b.Fingerprint {
			return Claim{State: StateMismatch}, nil
		}
		return Claim{State: StateInFlight, LeaseUntil: fl.expires}, nil
	}
	// Read under f.mu: a Complete deletes its flight only after its
	// record committed and entered the index, so this sees every record
	// whose flight is gone. A key without a live record needs no read;
	// get checks that the record expires at exp, after b.Now. An id that
	// shares its hash with another is read at each of the hash's
	// expiries until its own record is found.
	var buf [2]uint64
	now := expiresAt(b.Now)
	es := slices.DeleteFunc(f.idx.expiries(idHash(b.ID), buf[:0]), func(e uint64) bool { return e <= now })
	if len(es) > 1 {
		// Of two records of one id (a damaged file), the later wins.
		slices.Sort(es)
		slices.Reverse(es)
	}
	if len(es) > 0 {
		var c Claim
		err := s.read(func(tx *bolt.Tx) error {
			for _, exp := range es {
				r, err := get(tx, b.ID, exp)
				if err != nil || r == nil || r.resp == nil {
					if err != nil {
						return err
					}
					continue
				}
				if r.fingerprint != b.Fingerprint {
					c = Claim{State: StateMismatch}
				} else {
					c = Claim{State: StateDone, Response: r.resp}
				}
				return nil
			}
			return nil
		})
		if err != nil || c.State != 0 {
			return c, err
		}
	}
	if s.f.Broken() {
		// Fail closed: the answer could not be stored.
		return Claim{}, fmt.Errorf("%w: the store file was found damaged or replaced", idemstore.ErrJournalCorrupt)
	}
	if s.uncertain.Load() || s.f.Failed() != nil {
		// A commit failed with its record perhaps in the file, or the
		// file refuses writes after a failed fsync (a Complete's or a
		// Sweep's): the store's memory no longer says what the file
		// holds, and a handler run now could not store its answer.
		// Fail closed until the store is opened again.
		return Claim{}, fmt.Errorf("idemserver: begin %s: %w: an earlier commit of the store failed and its outcome is unknown; the store refuses new keys until it is opened again", b.ID, idemstore.ErrJournalWrite)
	}
	if s.gone.Load() {
		// A commit found the path naming another file, or none: every
		// commit fails until it names the store's again, and a handler
		// run meanwhile would run again at each retry, its answer never
		// stored. Fail closed until then.
		if err := s.f.StillNamed(); err != nil {
			return Claim{}, fmt.Errorf("idemserver: begin %s: %w", b.ID, err)
		}
		s.gone.Store(false)
	}
	// The token need only be unique among this store's flights, which
	// live in this process.
	f.tokens++
	tok := strconv.FormatUint(f.tokens, 36)
	f.m[b.ID] = &flight{fingerprint: b.Fingerprint, token: tok, expires: b.LeaseUntil, held: held}
	return Claim{State: StateAcquired, Token: tok, LeaseUntil: b.LeaseUntil}, nil
}

// Renew implements Store; it changes memory only.
func (s *BoltStore) Renew(ctx context.Context, id, token string, now, until time.Time) error {
	if s.closed.Load() {
		return ErrClosed
	}
	f := &s.flights
	f.mu.Lock()
	defer f.mu.Unlock()
	fl, err := f.held(id, token, now)
	if err != nil {
		return err
	}
	fl.expires = until
	return nil
}

// Release implements Store; it changes memory only.
func (s *BoltStore) Release(ctx context.Context, id, token string) error {
	if s.closed.Load() {
		return ErrClosed
	}
	f := &s.flights
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.held(id, token, time.Time{}); err != nil {
		return err
	}
	delete(f.m, id)
	return nil
}

// Complete implements Store: the key's one commit. The flight is marked
// completing while its record commits, so that no Begin takes it over
// meanwhile. A commit that failed for certain (nothing of it is in the
// file: a full disk) gives the key back to its holder. One whose record
// may be in the file (idem.ErrOutcomeUnknown: an fsync that failed after
// bbolt wrote its meta page), or after which the file refuses writes,
// keeps the key completing until the store is reopened, and the store
// then refuses new keys (Begin fails, idem.ErrJournalWrite): no answer
// whose storage is uncertain is replayed, and no second request runs the
// handler while the first run's record may exist.
func (s *BoltStore) Complete(ctx context.Context, c Completion) error {
	if c.Response == nil {
		return fmt.Errorf("idemserver: complete %s: nil response", c.ID)
	}
	if s.closed.Load() {
		return ErrClosed
	}
	f := &s.flights
	f.mu.Lock()
	fl, err := f.held(c.ID, c.Token, c.Now)
	if err == nil {
		fl.completing = true
	}
	h := idHash(c.ID)
	olds := f.idx.expiries(h, nil) // an expired record of c.ID not swept yet may be among them
	f.mu.Unlock()
	if err != nil {
		return err
	}
	// The record is encoded here, not on the writer's goroutine, which
	// every commit waits for.
	exp := expiresAt(c.Until)
	key, v := recordKey(exp, c.ID), encode(&record{fingerprint: fl.fingerprint, expires: c.Until, resp: c.Response})
	var old uint64
	replaced := false
	err = s.write(ctx, func(tx *bolt.Tx) (err error) {
		old, replaced, err = putRecord(tx, c.ID, h, olds, key, v)
		return err
	})
	if err != nil && (errors.Is(err, idemstore.ErrOutcomeUnknown) || s.f.Failed() != nil || s.holds(key, v)) {
		// The commit failed and its record may be in the file, or the
		// file refuses writes after it: the record's storage is
		// uncertain. The answer is withheld (the error), and the key
		// stays completing, so that no second request runs the handler
		// while the first run's record may exist, and none gets a replay
		// of a record that may not be durable: a retry is told the key is
		// in flight until the process restarts and the file is read
		// again. New keys are refused from now on (see Begin).
		s.uncertain.Store(true)
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		// Nothing was committed, for sure (a full disk): the key is
		// its holder's again.
		fl.completing = false
		return err
	}
	delete(f.m, c.ID)
	if replaced {
		f.idx.remove(h, old)
	}
	f.idx.add(h, exp)
	return nil
}

// holds reports whether the file, as this process reads it, holds the
// value v under key: after a commit that failed, whether it may have taken
// effect all the same.
func (s *BoltStore) holds(key, v []byte) bool {
	found := false
	err := s.f.View(func(tx *bolt.Tx) error {
		found = bytes.Equal(tx.Bucket(bucketRecords).Get(key), v)
		return nil
	})
	return err == nil && found
}

// putRecord stores the record v of id under key, and its index entry,
// after deleting the record of id at the first of the expiries olds that
// holds one, if any: it returns that expiry and whether it found one.
func putRecord(tx *bolt.Tx, id string, h uint64, olds []uint64, key, v []byte) (old uint64, replaced bool, err error) {
	recs, idx := tx.Bucket(bucketRecords), tx.Bucket(bucketIndex)
	recs.FillPercent, idx.FillPercent = 1, 1
	for _, e := range olds {
		if k := recordKey(e, id); recs.Get(k) != nil {
			if err := recs.Delete(k); err != nil {
				return 0, false, err
			}
			if err := indexSub(idx, e, h); err != nil {
				return 0, false, err
			}
			old, replaced = e, true
			break
		}
	}
	if err := recs.Put(key, v); err != nil {
		return 0, false, err
	}
	return old, replaced, indexAdd(idx, binary.BigEndian.Uint64(key), h)
}
