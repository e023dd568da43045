package idem

import (
	"errors"
	"sync"
	"time"
)

// OpenBoltStorePerWrite opens a BoltStore that commits every change in its
// own bbolt Update, without group commit: the benchmarks' baseline. It uses
// the same codec and layout as OpenBoltStore.
func OpenBoltStorePerWrite(path string, o *BoltOptions) (*BoltStore, error) {
	var opt BoltOptions
	if o != nil {
		opt = *o
	}
	opt.perWrite = true
	return OpenBoltStore(path, &opt)
}

// Journal bucket names and format marker, for tests that damage or forge
// a journal on purpose.
var (
	BucketOps     = bucketOps
	BucketMeta    = bucketMeta
	MetaFormatKey = metaFormatKey
)

// Len returns the number of records in m.
func (m *MemoryStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ops)
}

// StillNamed is the check that the journal's path still names its file,
// made before each commit.
func (s *BoltStore) StillNamed() error { return s.f.StillNamed() }

// OpenBoltStoreBeforeCompact opens a BoltStore that calls hook, with the
// journal's lock held, when Open has decided to compact it.
func OpenBoltStoreBeforeCompact(path string, o *BoltOptions, hook func()) (*BoltStore, error) {
	var opt BoltOptions
	if o != nil {
		opt = *o
	}
	opt.beforeCompact = hook
	return OpenBoltStore(path, &opt)
}

// OpenBoltStoreHoldingMarks opens a BoltStore whose queued Attempt and
// Finish marks are not committed on their own (for an hour), so they ride
// the next durable write or Close: for tests that need the marks in a
// given commit.
func OpenBoltStoreHoldingMarks(path string, o *BoltOptions) (*BoltStore, error) {
	var opt BoltOptions
	if o != nil {
		opt = *o
	}
	opt.asyncDelay = time.Hour
	return OpenBoltStore(path, &opt)
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
