package idemserver

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// MemoryStore is a Store that keeps its records in memory: they do not
// survive the process and are not shared with other replicas. It suits
// tests and single-process services that accept losing their keys on a
// restart. Its zero value is not usable; call NewMemoryStore.
type MemoryStore struct {
	mu      sync.Mutex
	records map[string]*memRecord
	tokens  uint64 // the last token given
	closed  bool
}

var _ LocalStore = (*MemoryStore)(nil)

type memRecord struct {
	fingerprint string
	token       string // empty once done
	expires     time.Time
	resp        *Response
	held        bool // in flight, held by a running request whatever expires says (BeginHeld)
}

// live reports whether r holds its key at now.
func (r *memRecord) live(now time.Time) bool {
	return r.held && r.resp == nil || r.expires.After(now)
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{records: make(map[string]*memRecord)}
}

// Begin implements Store.
func (s *MemoryStore) Begin(ctx context.Context, b Begin) (Claim, error) {
	return s.begin(b, false)
}

// BeginHeld implements LocalStore.
func (s *MemoryStore) BeginHeld(ctx context.Context, b Begin) (Claim, error) {
	return s.begin(b, true)
}

// Unhold implements LocalStore.
func (s *MemoryStore) Unhold(id, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.records[id]; r != nil && r.resp == nil && r.token == token {
		r.held = false
	}
}

func (s *MemoryStore) begin(b Begin, held bool) (Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Claim{}, ErrClosed
	}
	if r := s.records[b.ID]; r != nil && r.live(b.Now) {
		switch {
		case r.fingerprint != b.Fingerprint:
			return Claim{State: StateMismatch}, nil
		case r.resp == nil:
			return Claim{State: StateInFlight, LeaseUntil: r.expires}, nil
		default:
			return Claim{State: StateDone, Response: cloneResponse(r.resp)}, nil
		}
	}
	// The token need only be unique among this store's records, which
	// live in this process (as a BoltStore's flights do).
	s.tokens++
	tok := strconv.FormatUint(s.tokens, 36)
	s.records[b.ID] = &memRecord{fingerprint: b.Fingerprint, token: tok, expires: b.LeaseUntil, held: held}
	return Claim{State: StateAcquired, Token: tok, LeaseUntil: b.LeaseUntil}, nil
}

// held returns the in-flight record id held under token under a lease
// live at now; s.mu must be held.
func (s *MemoryStore) held(id, token string, now time.Time) (*memRecord, error) {
	if s.closed {
		return nil, ErrClosed
	}
	r := s.records[id]
	if r == nil || r.resp != nil || r.token != token || !r.live(now) {
		return nil, fmt.Errorf("key %s: %w", id, ErrLockLost)
	}
	return r, nil
}

// Renew implements Store.
func (s *MemoryStore) Renew(ctx context.Context, id, token string, now, until time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.held(id, token, now)
	if err != nil {
		return err
	}
	r.expires = until
	return nil
}

// Complete implements Store.
func (s *MemoryStore) Complete(ctx context.Context, c Completion) error {
	if c.Response == nil {
		return fmt.Errorf("idemserver: complete %s: nil response", c.ID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.held(c.ID, c.Token, c.Now)
	if err != nil {
		return err
	}
	r.resp, r.token, r.expires, r.held = cloneResponse(c.Response), "", c.Until, false
	return nil
}

// Release implements Store.
func (s *MemoryStore) Release(ctx context.Context, id, token string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.held(id, token, time.Time{}); err != nil {
		return err
	}
	delete(s.records, id)
	return nil
}

// Sweep implements Store.
func (s *MemoryStore) Sweep(ctx context.Context, now time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	n := 0
	for id, r := range s.records {
		if !r.live(now) {
			delete(s.records, id)
			n++
		}
	}
	return n, nil
}

// Close implements Store. It drops every record.
func (s *MemoryStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.closed, s.records = true, nil
	return nil
}

func cloneResponse(r *Response) *Response {
	if r == nil {
		return nil
	}
	if r.NotKept {
		return &Response{Status: r.Status, NotKept: true}
	}
	return &Response{Status: r.Status, Header: r.Header.Clone(), Body: append([]byte(nil), r.Body...)}
}
