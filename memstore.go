package idem

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// MemoryStore is a KeyStore that keeps its records in memory. It has the
// same semantics as the bbolt journal but NO DURABILITY: a crash forgets
// every key, so operations in doubt cannot be resumed. Use it in tests, or
// when keys only need to survive retries within one process.
//
// The zero value is not usable; create one with NewMemoryStore.
//
// Finished records are kept until Sweep deletes them (the Client sweeps
// once an hour), so under steady load the store holds the retention
// window's worth of finished records, each without its request. Sweep
// takes time in proportion to the records it deletes, not to the store.
type MemoryStore struct {
	mu     sync.Mutex
	ops    map[string]*Operation
	names  map[string]string
	closed bool
	policy Policy

	// done lists finished records in the order they finished, from
	// doneHead on, for Sweep. An entry is stale if its record has changed
	// since (it has a later entry, or is pending again).
	done     []doneRef
	doneHead int

	// block is the room left for new records: they are made recordBlock
	// at a time, one allocation for all.
	block []Operation
}

// recordBlock is how many records one allocation holds. A block stays
// in memory while any of its records does; records are swept in about
// the order they were made, so blocks go with them.
const recordBlock = 32

// newRecord returns room for a new record. m.mu is held.
func (m *MemoryStore) newRecord() *Operation {
	if len(m.block) == 0 {
		m.block = make([]Operation, recordBlock)
	}
	r := &m.block[0]
	m.block = m.block[1:]
	return r
}

type doneRef struct {
	key     string
	updated time.Time
}

var (
	_ KeyStore    = (*MemoryStore)(nil)
	_ Inspector   = (*MemoryStore)(nil)
	_ PolicyStore = (*MemoryStore)(nil)
)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{ops: make(map[string]*Operation), names: make(map[string]string)}
}

// copyOp returns a copy of op whose header map the caller may change. The
// body is shared: neither the store nor the transport writes to it.
func copyOp(op *Operation) Operation {
	c := *op
	if op.Header != nil {
		c.Header = op.Header.Clone()
	}
	return c
}

// lock locks m and checks ctx and that m is open; on success the caller
// must unlock m.mu.
func (m *MemoryStore) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// Reserve implements KeyStore.
func (m *MemoryStore) Reserve(ctx context.Context, op Operation) (Operation, bool, error) {
	if err := m.lock(ctx); err != nil {
		return Operation{}, false, err
	}
	defer m.mu.Unlock()
	if op.Name != "" {
		if key, ok := m.names[op.Name]; ok {
			return copyOp(m.ops[key]), false, nil
		}
	}
	if ex, ok := m.ops[op.Key]; ok {
		return copyOp(ex), false, nil
	}
	rec := m.newRecord()
	*rec = op // shares op.Header and op.Body, as Reserve's contract allows
	m.ops[op.Key] = rec
	m.noteDone(rec)
	if op.Name != "" {
		m.names[op.Name] = op.Key
	}
	return op, true, nil
}

// Acquire implements KeyStore.
func (m *MemoryStore) Acquire(ctx context.Context, key string, l Lease, req Request) (Operation, error) {
	if err := m.lock(ctx); err != nil {
		return Operation{}, err
	}
	defer m.mu.Unlock()
	op, ok := m.ops[key]
	if !ok {
		return Operation{}, fmt.Errorf("acquire %q: %w", key, ErrNotFound)
	}
	if op.State == StatePending && l.BlockedBy(op.Owner, op.LeaseUntil) {
		return Operation{}, fmt.Errorf("acquire %q: leased to %q: %w", key, op.Owner, ErrInProgress)
	}
	if op.State != StatePending {
		op.State = StatePending
		op.URL, op.Header, op.Body = req.URL, req.Header.Clone(), req.Body
	}
	op.Owner, op.LeaseUntil = l.Owner, l.Until
	op.Updated = l.At
	return copyOp(op), nil
}

// Renew implements KeyStore.
func (m *MemoryStore) Renew(ctx context.Context, key string, l Lease) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	op, ok := m.ops[key]
	if !ok {
		return fmt.Errorf("renew %q: %w", key, ErrNotFound)
	}
	if op.State != StatePending || op.Owner != l.Owner {
		return fmt.Errorf("renew %q: %w", key, ErrLeaseLost)
	}
	op.LeaseUntil = l.Until
	return nil
}

// Get implements KeyStore.
func (m *MemoryStore) Get(ctx context.Context, key string) (Operation, error) {
	if err := m.lock(ctx); err != nil {
		return Operation{}, err
	}
	defer m.mu.Unlock()
	op, ok := m.ops[key]
	if !ok {
		return Operation{}, fmt.Errorf("get %q: %w", key, ErrNotFound)
	}
	return copyOp(op), nil
}

// Attempt implements KeyStore.
func (m *MemoryStore) Attempt(ctx context.Context, key string, a Attempt) error {
	return m.update(ctx, key, a.At, a.Owner, func(op *Operation) {
		op.Attempts += a.Sent
		op.LastStatus, op.LastError = a.Status, a.Err
		op.History = AppendHistory(op.History, a) // a new slice: copies share none
	})
}

// Finish implements KeyStore.
func (m *MemoryStore) Finish(ctx context.Context, key string, o Outcome) error {
	return m.update(ctx, key, o.At, o.Owner, func(op *Operation) {
		op.State = o.State
		op.Attempts += o.Sent
		op.LastStatus, op.LastError, op.URL = o.Status, o.Err, o.URL
		op.Header, op.Body = nil, nil
		op.LeaseUntil = time.Time{}
	})
}

// update applies a mark made for owner: only to a pending record owner
// holds, or to any record if owner is "" (KeyStore.Attempt).
func (m *MemoryStore) update(ctx context.Context, key string, at time.Time, owner string, fn func(*Operation)) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	op, ok := m.ops[key]
	if !ok {
		return fmt.Errorf("update %q: %w", key, ErrNotFound)
	}
	if owner != "" && (op.State != StatePending || op.Owner != owner) {
		return nil // the mark's owner lost the record: it changes nothing
	}
	fn(op)
	op.Updated = at
	m.noteDone(op)
	return nil
}

// noteDone lists op for Sweep if it is finished. m.mu is held.
func (m *MemoryStore) noteDone(op *Operation) {
	if op.State.Finished() {
		m.done = append(m.done, doneRef{op.Key, op.Updated})
	}
}

// Pending implements KeyStore. It sorts the pending records on each call,
// which is fine for the test-sized journals a MemoryStore is for.
func (m *MemoryStore) Pending(ctx context.Context, after string, limit int) ([]Operation, error) {
	return m.list(ctx, nil, after, limit, true)
}

// Walk implements Inspector: it lists records of every state, without
// their requests. It sorts the records on each call.
func (m *MemoryStore) Walk(ctx context.Context, after string, limit int) ([]Operation, error) {
	ops, err := m.list(ctx, nil, after, limit, false)
	for i := range ops {
		ops[i].Header, ops[i].Body = nil, nil
	}
	return ops, err
}

// Claim implements KeyStore.
func (m *MemoryStore) Claim(ctx context.Context, l Lease, after string, limit int) ([]Operation, error) {
	return m.list(ctx, &l, after, limit, true)
}

// list returns the records after after, in key order, pending ones only
// with pendingOnly; with a lease, only those it may take, which it leases.
func (m *MemoryStore) list(ctx context.Context, l *Lease, after string, limit int, pendingOnly bool) ([]Operation, error) {
	if err := m.lock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	var pend []*Operation
	for key, op := range m.ops {
		if (op.State == StatePending || !pendingOnly) && key > after && (l == nil || !l.BlockedBy(op.Owner, op.LeaseUntil)) {
			pend = append(pend, op)
		}
	}
	slices.SortFunc(pend, func(a, b *Operation) int { return strings.Compare(a.Key, b.Key) })
	if limit > 0 && len(pend) > limit {
		pend = pend[:limit]
	}
	out := make([]Operation, len(pend))
	for i, op := range pend {
		if l != nil {
			op.Owner, op.LeaseUntil = l.Owner, l.Until
		}
		out[i] = copyOp(op)
	}
	return out, nil
}

// Sweep implements KeyStore. It takes the finished records in the order
// they finished, up to the first one finished at or after cutoff.
func (m *MemoryStore) Sweep(ctx context.Context, cutoff time.Time) (int, error) {
	if err := m.lock(ctx); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	n := 0
	for m.doneHead < len(m.done) && m.done[m.doneHead].updated.Before(cutoff) {
		d := m.done[m.doneHead]
		m.done[m.doneHead] = doneRef{}
		m.doneHead++
		op, ok := m.ops[d.key]
		if !ok || !op.State.Finished() || !op.Updated.Equal(d.updated) {
			continue // stale: swept already, pending again, or changed since
		}
		delete(m.ops, d.key)
		if op.Name != "" && m.names[op.Name] == d.key {
			delete(m.names, op.Name)
		}
		n++
	}
	if m.doneHead > len(m.done)/2 {
		m.done = append(m.done[:0:0], m.done[m.doneHead:]...)
		m.doneHead = 0
	}
	return n, nil
}

// Close implements KeyStore. Later calls of every method, Close included,
// return ErrClosed.
func (m *MemoryStore) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.closed = true
	return nil
}

// Named implements Inspector.
func (m *MemoryStore) Named(ctx context.Context, name string) (Operation, error) {
	if err := m.lock(ctx); err != nil {
		return Operation{}, err
	}
	defer m.mu.Unlock()
	key, ok := m.names[name]
	if !ok {
		return Operation{}, fmt.Errorf("operation %q: %w", name, ErrNotFound)
	}
	return copyOp(m.ops[key]), nil
}

// Policy implements PolicyStore.
func (m *MemoryStore) Policy(ctx context.Context) (Policy, error) {
	if err := m.lock(ctx); err != nil {
		return Policy{}, err
	}
	defer m.mu.Unlock()
	return m.policy, nil
}

// SetPolicy implements PolicyStore.
func (m *MemoryStore) SetPolicy(ctx context.Context, p Policy) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	m.policy = p
	return nil
}
