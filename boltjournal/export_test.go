package boltjournal

import (
	"context"
	"time"

	bolt "go.etcd.io/bbolt"
)

// OpenPerWrite opens a Store that commits every change in its
// own bbolt Update, without group commit: the benchmarks' baseline. It uses
// the same codec and layout as Open; free pages are scrubbed at Close only.
func OpenPerWrite(path string, o *Options) (*Store, error) {
	var opt Options
	if o != nil {
		opt = *o
	}
	opt.ScrubDelay = -1
	s, err := Open(path, &opt)
	if err != nil {
		return nil, err
	}
	if err := s.w.Close(); err != nil { // nothing is queued yet
		s.Close()
		return nil, err
	}
	s.w = perWrite{s.f}
	return s, nil
}

// perWrite is the committer of OpenPerWrite: each change is its own
// bbolt Update.
type perWrite struct{ f *boltFile }

func (p perWrite) Do(ctx context.Context, fn func(*bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return p.f.Update(fn)
}

func (p perWrite) Go(fn func(*bolt.Tx) error) error { return p.f.Update(fn) }

func (p perWrite) Sync(context.Context) error { return nil }

func (p perWrite) Close() error { return nil }

// Journal bucket names and format marker, for tests that damage or forge
// a journal on purpose.
var (
	BucketOps     = bucketOps
	BucketMeta    = bucketMeta
	MetaFormatKey = metaFormatKey
)

// StillNamed is the check that the journal's path still names its file,
// made before each commit.
func (s *Store) StillNamed() error { return s.f.StillNamed() }

// OpenBeforeCompact opens a Store that calls hook, with the
// journal's lock held, when Open has decided to compact it.
func OpenBeforeCompact(path string, o *Options, hook func()) (*Store, error) {
	var opt Options
	if o != nil {
		opt = *o
	}
	opt.beforeCompact = hook
	return Open(path, &opt)
}

// OpenHoldingMarks opens a Store whose queued Attempt and
// Finish marks are not committed on their own (for an hour), so they ride
// the next durable write or Close: for tests that need the marks in a
// given commit.
func OpenHoldingMarks(path string, o *Options) (*Store, error) {
	var opt Options
	if o != nil {
		opt = *o
	}
	opt.asyncDelay = time.Hour
	return Open(path, &opt)
}
