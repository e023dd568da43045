package idem

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// MemoryStore is a KeyStore that keeps its records in memory. It has the
// same semantics as the bbolt journal but NO DURABILITY: a crash forgets
// every key, so operations in doubt cannot be resumed. Use it in tests, or
// when keys only need to survive retries within one process.
//
// The zero value is not usable; create one with NewMemoryStore.
type MemoryStore struct {
	mu     sync.Mutex
	ops    map[string]*Operation
	names  map[string]string
	closed bool
	now    func() time.Time
}

var _ KeyStore = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{ops: make(map[string]*Operation), names: make(map[string]string), now: time.Now}
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

func (m *MemoryStore) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if m.closed {
		return ErrClosed
	}
	return nil
}

// Reserve implements KeyStore.
func (m *MemoryStore) Reserve(ctx context.Context, op Operation) (Operation, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx); err != nil {
		return Operation{}, false, err
	}
	if err := checkKey(op.Key); err != nil {
		return Operation{}, false, err
	}
	if op.Name != "" {
		if key, ok := m.names[op.Name]; ok {
			return copyOp(m.ops[key]), false, nil
		}
	}
	if ex, ok := m.ops[op.Key]; ok {
		return copyOp(ex), false, nil
	}
	newRecord(&op, m.now())
	rec := op // shares op.Header and op.Body, as Reserve's contract allows
	m.ops[op.Key] = &rec
	if op.Name != "" {
		m.names[op.Name] = op.Key
	}
	return op, true, nil
}

// Reopen implements KeyStore.
func (m *MemoryStore) Reopen(ctx context.Context, key string, header http.Header, body []byte) (Operation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx); err != nil {
		return Operation{}, err
	}
	op, ok := m.ops[key]
	if !ok {
		return Operation{}, fmt.Errorf("reopen %s: %w", key, ErrNotFound)
	}
	op.State = StatePending
	op.Header = header.Clone()
	op.Body = body
	op.Updated = m.now()
	return copyOp(op), nil
}

// Get implements KeyStore.
func (m *MemoryStore) Get(ctx context.Context, key string) (Operation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx); err != nil {
		return Operation{}, err
	}
	op, ok := m.ops[key]
	if !ok {
		return Operation{}, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	return copyOp(op), nil
}

// Named implements KeyStore.
func (m *MemoryStore) Named(ctx context.Context, name string) (Operation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx); err != nil {
		return Operation{}, err
	}
	key, ok := m.names[name]
	if !ok {
		return Operation{}, fmt.Errorf("operation %q: %w", name, ErrNotFound)
	}
	return copyOp(m.ops[key]), nil
}

// Attempt implements KeyStore.
func (m *MemoryStore) Attempt(ctx context.Context, key string, out Outcome) error {
	return m.update(ctx, key, func(op *Operation) {
		op.Attempts++
		op.LastStatus, op.LastError = out.Status, out.Err
	})
}

// Finish implements KeyStore.
func (m *MemoryStore) Finish(ctx context.Context, key string, out Outcome) error {
	if !out.State.Finished() {
		return fmt.Errorf("idem: finish %s: state %s is not final", key, out.State)
	}
	return m.update(ctx, key, func(op *Operation) {
		op.State = out.State
		op.Attempts += out.Attempts
		op.LastStatus, op.LastError = out.Status, out.Err
		op.Header, op.Body = nil, nil
	})
}

func (m *MemoryStore) update(ctx context.Context, key string, fn func(*Operation)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx); err != nil {
		return err
	}
	op, ok := m.ops[key]
	if !ok {
		return fmt.Errorf("update %s: %w", key, ErrNotFound)
	}
	fn(op)
	op.Updated = m.now()
	return nil
}

// pendingLess orders pending records oldest first, then by key.
func pendingLess(a, b *Operation) int {
	if c := a.Created.Compare(b.Created); c != 0 {
		return c
	}
	return cmp.Compare(a.Key, b.Key)
}

// Pending implements KeyStore. It sorts all pending records on each call,
// which is fine for the test-sized journals a MemoryStore is for.
func (m *MemoryStore) Pending(ctx context.Context, after string, limit int) ([]Operation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	var from *Operation
	if after != "" {
		if from = m.ops[after]; from == nil {
			return nil, fmt.Errorf("pending after %s: %w", after, ErrNotFound)
		}
	}
	var pend []*Operation
	for _, op := range m.ops {
		if op.State == StatePending && (from == nil || pendingLess(op, from) > 0) {
			pend = append(pend, op)
		}
	}
	slices.SortFunc(pend, pendingLess)
	if limit > 0 && len(pend) > limit {
		pend = pend[:limit]
	}
	out := make([]Operation, len(pend))
	for i, op := range pend {
		out[i] = copyOp(op)
	}
	return out, nil
}

// Sweep implements KeyStore.
func (m *MemoryStore) Sweep(ctx context.Context, cutoff time.Time) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx); err != nil {
		return 0, err
	}
	n := 0
	for key, op := range m.ops {
		if op.State.Finished() && op.Updated.Before(cutoff) {
			delete(m.ops, key)
			if op.Name != "" && m.names[op.Name] == key {
				delete(m.names, op.Name)
			}
			n++
		}
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
