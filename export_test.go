package idem

import (
	"errors"
	"sync"
)

// BucketOps is the name of the bbolt journal's bucket of records
// (package boltjournal's), for the tests that damage a record under a
// Client.
var BucketOps = []byte("ops")

// Len returns the number of records in m.
func (m *MemoryStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ops)
}

// StalledBody is a body whose every Read blocks until it is closed, for
// the tests of the guards against a response body that stalls.
type StalledBody struct {
	once   sync.Once
	closed chan struct{}
}

// NewStalledBody returns an open StalledBody.
func NewStalledBody() *StalledBody { return &StalledBody{closed: make(chan struct{})} }

func (s *StalledBody) Read([]byte) (int, error) { <-s.closed; return 0, errors.New("closed") }
func (s *StalledBody) Close() error             { s.once.Do(func() { close(s.closed) }); return nil }

// Closed returns a channel that is closed once the body is.
func (s *StalledBody) Closed() <-chan struct{} { return s.closed }
