package boltjournal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/groupcommit"
	bolt "go.etcd.io/bbolt"
)

// Store is the durable KeyStore: a bbolt file journal with group commit.
// It is safe for concurrent use.
//
// Reserve, Acquire and Renew are committed together with every other
// change queued while the previous commit ran (one transaction and one
// fsync per group) and return only once their own commit is durable.
// Attempt and Finish are queued into the same writer and return at once:
// their change rides the next commit. A queued change whose commit failed
// is kept and rides the next one (Options.OnWriteError hears of the
// failure); Close returns an error if it still cannot be written. Get,
// Pending and Claim wait for queued changes first, so a reader always sees
// its own writes. Close commits everything queued.
//
// A failed commit (see internal/boltfile's File.Update): one whose meta
// page reached the file may be durable, and its Reserve or Acquire
// returns an error matching ErrOutcomeUnknown (the caller keeps the key:
// the operation is in doubt); one that failed before returns
// ErrJournalWrite (nothing of it is durable). After a failed fsync or an
// I/O error the store trusts nothing it holds in memory: every later
// write, queued changes included, fails with ErrJournalWrite until the
// journal is opened again, so nothing is sent, and nothing is marked
// finished, on the strength of a commit that failed. Only a full disk
// (a write or the file's growth refused for space) is not such a failure.
// A new journal is created whole (see OpenBoltStore's file handling in
// internal/boltfile) and its directory fsynced before Open returns.
//
// Each operation is one record in one B+tree, its request inline while it
// is pending (a body of 32 KiB or more is stored apart, under the key
// followed by a NUL byte, in the same B+tree); a finished record keeps no
// request. Without a trace or an attempt history it takes under 200 bytes
// (TestFinishedRecordIsSmall); each recorded attempt (at most MaxHistory)
// and the trace add theirs.
// bbolt reuses freed pages, so under steady load with Sweep the file stops
// growing once the retention window is full. The request of a finished
// operation is gone from the file within Options.ScrubDelay: freed
// pages are overwritten with zeros.
//
// Leases are kept as the KeyStore contract says, with one addition: the
// file lock proves that no other process uses the journal, so a lease left
// by an earlier process has lapsed as soon as the file is opened again.
// What its format cannot hold it refuses: Reserve of an empty key or of one
// ending in a NUL byte (ErrInvalidKey); the journal's keys are neither.
//
// After a crash, every Reserve and Acquire that returned is in the file;
// transactions that had not finished committing are rolled back by bbolt.
// Before each commit the store checks that the journal's path still names
// its file: a journal removed while open refuses writes (ErrJournalWrite).
// Every transaction checks that bbolt's transaction ID has not gone back:
// a file overwritten in place with an older copy is ErrJournalCorrupt, and
// the store refuses all access. Close reports either.
//
// What Open checks: the file's size against its pages, its format
// marker and its buckets (a journal that lost its ops or names bucket is
// ErrJournalCorrupt, and is not given an empty one); then, walking the
// records and the names once each in key order (which reads every leaf
// page of both B+trees, so a damaged page is found), that every pending
// record and its body decode and pass their checksums, that every name
// maps to a well-formed key that has a record, and that every named
// pending record is found by its name.
// Finished records, and the names of finished records, are checked when
// they are read. A record written by a newer idem is no damage: Open
// accepts it, and Pending and Resume report it (ErrRecordVersion). The
// walks cost a cursor step per record and name; decoding, only the
// pending records (about 20 ms for 100,000 finished and 1,000 pending
// operations, half of them named: BenchmarkOpenCheck).
//
// One opener at a time: after taking the file's lock, Open checks that the
// locked file is still the one at the path (another opener may have
// compacted and replaced it meanwhile) and otherwise waits for the new
// one. A path that is a symbolic link is followed, and stays a link.
type Store struct {
	f      *boltFile
	w      committer
	log    *slog.Logger
	o      Options
	closed atomic.Bool

	// owners are the lease owners seen since the file was opened. The file
	// lock proves that no other process uses the journal, so a lease held
	// by any other owner was left by a process that is gone: it has lapsed.
	owners sync.Map

	// live holds the keys of records this store made or saw pending and
	// has not finished: Attempt and Finish on them need no read
	// transaction to know the record exists.
	liveMu sync.Mutex
	live   map[string]struct{}

	scrubKick chan struct{}
	// scrubAsked is set by the first kick after a scrub's timer fired, so
	// that the kicks of later commits (one per finish) do not wake the
	// scrubber while its timer runs.
	scrubAsked atomic.Bool
	scrubStop  chan struct{}
	scrubDone  chan struct{}

	// scratch is shared by the changes of each write transaction.
	scratch txScratch
}

var (
	_ idemstore.KeyStore    = (*Store)(nil)
	_ idemstore.LastChanger = (*Store)(nil)
	_ idemstore.Inspector   = (*Store)(nil)
	_ idemstore.PolicyStore = (*Store)(nil)
)

// LastChange implements LastChanger: it returns when the journal file was
// last written before this store opened it (its modification time), or the
// zero time for a new journal. A Client uses it to bound how far it trusts
// its wall clock when it sweeps.
func (s *Store) LastChange(context.Context) (time.Time, error) {
	return s.f.Modified(), nil
}

// Open opens the journal at path, creating the file (mode 0600) if
// it does not exist.
// It returns an error matching ErrJournalLocked if another process or handle
// holds the file for longer than o.LockTimeout; ErrJournalCorrupt for a
// damaged, truncated, empty or foreign file, or one whose pending records
// or name mappings fail Open's check (see Store); ErrRecordVersion for
// a journal of another format version; and ErrJournalWrite if the file
// cannot be created or opened for writing (an empty path, a directory, a
// missing parent directory, a read-only file system).
func Open(path string, o *Options) (*Store, error) {
	var opt Options
	if o != nil {
		opt = *o
	}
	if opt.LockTimeout <= 0 {
		opt.LockTimeout = defaultLockTimeout
	}
	if opt.MaxGroup <= 0 {
		opt.MaxGroup = defaultMaxGroup
	}
	if opt.ScrubDelay == 0 {
		opt.ScrubDelay = defaultScrubDelay
	}
	s := &Store{o: opt, log: opt.Logger, live: make(map[string]struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	f, err := openFile(path, opt.LockTimeout, opt.ReadOnly, opt.beforeCompact)
	if err != nil {
		return nil, err
	}
	s.f = f
	if !opt.SkipCheck {
		if err := f.check(); err != nil {
			// The check only reads: a panic in its read transaction left
			// no bbolt lock held (View rolls back), so the file is closed
			// in full, unmapped too, which releases its lock.
			_ = f.ReleaseAfterRead()
			return nil, fmt.Errorf("open journal %s: %w", path, err)
		}
	}
	s.w = groupcommit.New(f.Update, groupcommit.Options{
		MaxGroup:   opt.MaxGroup,
		Recover:    f.Corrupt,
		OnCommit:   opt.OnCommit,
		AsyncDelay: opt.asyncDelay,
		OnAsyncError: func(err error) {
			s.log.Warn("idem: queued journal change not written yet", "err", err)
			if opt.OnWriteError != nil {
				opt.OnWriteError(err)
			}
		},
	})
	if opt.ScrubDelay > 0 && !opt.ReadOnly {
		s.scrubKick = make(chan struct{}, 1)
		s.scrubStop, s.scrubDone = make(chan struct{}), make(chan struct{})
		f.kick = s.kickScrub
		go s.scrubber(opt.ScrubDelay)
	}
	return s, nil
}

// committer commits the journal's changes: the group commit
// (internal/groupcommit's Writer) that Open makes. The benchmarks' baseline
// puts in one that commits each change in its own bbolt Update
// (export_test.go).
type committer interface {
	// Do commits fn durably, in a group with other writers.
	Do(ctx context.Context, fn func(*bolt.Tx) error) error
	// Go queues fn for the next commit and returns at once.
	Go(fn func(*bolt.Tx) error) error
	// Sync waits until every change queued so far has committed.
	Sync(ctx context.Context) error
	// Close commits what is queued and stops.
	Close() error
}

// write commits fn durably, in a group with other writers.
func (s *Store) write(ctx context.Context, fn func(*bolt.Tx) error) error {
	return closedErr(s.w.Do(ctx, fn))
}

// writeAsync queues fn for the next commit and returns at once.
func (s *Store) writeAsync(fn func(*bolt.Tx) error) error {
	return closedErr(s.w.Go(fn))
}

// settle waits until every change queued so far has committed, so a read
// sees the caller's own Attempt and Finish.
func (s *Store) settle(ctx context.Context) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return closedErr(s.w.Sync(ctx))
}

func closedErr(err error) error {
	if errors.Is(err, groupcommit.ErrClosed) {
		return idemstore.ErrClosed
	}
	return err
}

func (s *Store) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return idemstore.ErrClosed
	}
	return nil
}

func (s *Store) setLive(key string) {
	s.liveMu.Lock()
	s.live[key] = struct{}{}
	s.liveMu.Unlock()
}

// takeLive reports whether key is live; with drop, it is no longer.
func (s *Store) takeLive(key string, drop bool) bool {
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	_, ok := s.live[key]
	if ok && drop {
		delete(s.live, key)
	}
	return ok
}

// Get implements KeyStore.
func (s *Store) Get(ctx context.Context, key string) (idemstore.Operation, error) {
	if err := s.settle(ctx); err != nil {
		return idemstore.Operation{}, err
	}
	var op idemstore.Operation
	err := s.f.View(func(tx *bolt.Tx) error {
		ops, err := opsOf(tx)
		if err != nil {
			return err
		}
		op, err = loadOp(ops, key)
		return err
	})
	if err != nil {
		return idemstore.Operation{}, fmt.Errorf("get %q: %w", key, err)
	}
	return op, nil
}

// Named implements Inspector.
func (s *Store) Named(ctx context.Context, name string) (idemstore.Operation, error) {
	if err := s.settle(ctx); err != nil {
		return idemstore.Operation{}, err
	}
	var op idemstore.Operation
	err := s.f.View(func(tx *bolt.Tx) error {
		names, err := namesOf(tx)
		if err != nil {
			return err
		}
		ops, err := opsOf(tx)
		if err != nil {
			return err
		}
		key := names.Get([]byte(name))
		if key == nil {
			return fmt.Errorf("operation %q: %w", name, idemstore.ErrNotFound)
		}
		op, err = loadOp(ops, string(key))
		return err
	})
	if err != nil {
		return idemstore.Operation{}, err
	}
	return op, nil
}

// Close commits every queued change, overwrites the free pages that may
// still hold requests, makes everything durable and closes the file.
// Later calls of any method, Close included, return ErrClosed. Its error
// matches ErrJournalWrite if a queued change could not be written.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return idemstore.ErrClosed
	}
	if s.scrubStop != nil {
		close(s.scrubStop)
		<-s.scrubDone
	}
	var werr, serr error
	if s.w != nil {
		if err := s.w.Close(); err != nil {
			werr = fmt.Errorf("idem: close journal: %w: %w", idemstore.ErrJournalWrite, err)
		}
	}
	if werr == nil && s.f.scrubDue() && !s.f.Broken() {
		serr = s.f.Update(s.f.scrub)
	}
	// A journal replaced under this store (renamed over, or overwritten in
	// place with an older copy) is reported: what it accepted may be lost.
	var rerr error
	if !s.f.Broken() {
		rerr = s.f.View(func(*bolt.Tx) error { return nil })
		if rerr == nil {
			rerr = s.f.StillNamed()
		}
	} else {
		rerr = fmt.Errorf("idem: close journal: %w: it was found damaged or replaced while open; changes accepted since may be lost", idemstore.ErrJournalCorrupt)
	}
	return errors.Join(werr, serr, rerr, s.f.Release())
}
