package idem

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// This file holds the bbolt file handling of BoltStore: opening and
// locking the file (the one at the path), the format marker, turning
// bbolt's faults into idem's sentinels, the checks that the file still has
// its name and has not gone back to an older copy. boltcompact.go compacts
// it at Open, boltscrub.go scrubs its free pages, boltcheck.go checks its
// records, boltstore.go holds the KeyStore methods, boltrecord.go the
// records, boltwalk.go the walks.

// BoltOptions tune a BoltStore. A nil *BoltOptions, and every zero field,
// means the default.
type BoltOptions struct {
	// LockTimeout bounds how long OpenBoltStore waits for another process
	// or handle (in this process too) to release the journal file before it
	// returns an error matching ErrJournalLocked. Zero means 2 seconds.
	LockTimeout time.Duration
	// MaxGroup caps how many changes one commit (one fsync) carries. Zero
	// means 1024.
	MaxGroup int
	// Logger receives warnings the store cannot return to a caller: a
	// record Sweep kept because it could not read it, or a commit of
	// changes queued by Attempt or Finish that failed. Nil is silent.
	Logger *slog.Logger
	// OnWriteError, if set, is called (on the store's writer goroutine;
	// it must not block) when a commit carrying changes queued by Attempt
	// or Finish failed. Those changes are kept and ride the next commit;
	// Close returns an error if they still cannot be written.
	OnWriteError func(error)
	// OnCommit, if set, is called on the store's writer goroutine after
	// every group commit with the number of changes it carried, how long it
	// took (fsyncs included) and its error: the journal's commit latency
	// and group size, for metrics. It must not block.
	OnCommit func(changes int, latency time.Duration, err error)
	// ScrubDelay bounds how long the request (header and body) of a
	// finished operation may stay readable in the free pages of the file:
	// bbolt frees pages without clearing them, so the store overwrites the
	// free pages with zeros, in a commit at most ScrubDelay after a finish.
	// Zero means 1 second; a negative value scrubs only at Close.
	ScrubDelay time.Duration

	// perWrite makes every change its own bbolt Update, without group
	// commit. It exists for the benchmarks' baseline.
	perWrite bool
	// SkipCheck opens a journal without Open's check of its pending
	// records and name mappings, for tools that read what they can of a
	// damaged journal (the idem command's ls, pending, show and stats,
	// with BoltStore.Salvage). An application must not set it: the check
	// is what keeps it from trusting a damaged journal.
	SkipCheck bool

	// beforeCompact runs when Open has decided to compact the journal,
	// with its lock held. It exists for tests.
	beforeCompact func()
	// asyncDelay, if set, replaces how long queued Attempt and Finish
	// marks wait for a durable write to carry them (groupcommit's
	// AsyncDelay). It exists for tests that need the marks to ride a
	// given commit.
	asyncDelay time.Duration
}

// Defaults of BoltOptions.
const (
	defaultLockTimeout = 2 * time.Second
	defaultMaxGroup    = 1024
	defaultScrubDelay  = time.Second
)

// Journal format 2: bucket names and the format marker. meta holds the
// marker that tells an idem journal from another bbolt file; ops maps each
// key to its record (codec version 2, the request inline while pending);
// names maps an operation name to its key. There are no other indexes:
// Pending, Claim and Sweep walk ops in key order.
var (
	bucketMeta    = []byte("meta")
	bucketOps     = []byte("ops")
	bucketNames   = []byte("names")
	metaFormatKey = []byte("format")
	metaFormat    = []byte("idem-journal/2")
	formatPrefix  = "idem-journal/"
)

// opsFill is the fill percent of the ops bucket's pages. UUIDv7 keys are
// appended in order, so bbolt's default of one half would leave every page
// half empty.
const opsFill = 0.9

// boltFile is the bbolt file of a BoltStore and what guards it.
type boltFile struct {
	path     string // the journal's path, as given (perhaps a symbolic link)
	real     string // the file it names, links resolved: what is opened and compacted
	timeout  time.Duration
	modified time.Time // the file's modification time when it was opened
	db       *bolt.DB
	file     *os.File    // bbolt's file handle, to release a broken journal
	id       os.FileInfo // the open file, to tell whether path still names it
	broken   atomic.Bool // bbolt panicked or faulted; its locks may be held

	// readers is held shared by read transactions and exclusively while
	// free pages are scrubbed: a reader's snapshot may still use a page
	// that bbolt lists as free.
	readers sync.RWMutex
	// scrubbed[id] is set for a free page that was zeroed and stayed free.
	scrubbed []bool
	// dropped is the highest transaction ID that dropped a request;
	// scrubbedTo the highest one whose freed pages were zeroed.
	dropped, scrubbedTo atomic.Uint64
	// kick, if set, is called when a transaction drops a request.
	kick func()
	// seenTx is the highest bbolt transaction ID this handle has seen
	// committed. IDs only grow: a lower one means the file was overwritten
	// in place with an older copy.
	seenTx atomic.Uint64
	// beforeCompact, if set, runs when Open has decided to compact, with
	// the journal's lock held (a test hook).
	beforeCompact func()
}

// openFile opens, or creates, the bbolt file at path and checks its
// format. Only a missing file creates a journal: an existing empty or short
// file is a lost journal (ErrJournalCorrupt).
func openFile(path string, timeout time.Duration, beforeCompact func()) (*boltFile, error) {
	f := &boltFile{path: path, real: path, timeout: timeout, beforeCompact: beforeCompact}
	if path == "" {
		return nil, fmt.Errorf("open journal: %w: empty path", ErrJournalWrite)
	}
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return nil, fmt.Errorf("open journal %s: %w: the path is a directory", path, ErrJournalWrite)
	case err == nil && fi.Size() == 0:
		return nil, fmt.Errorf("open journal %s: %w: the file is empty: a journal that lost its contents, not a new one (remove it to start a new journal)", path, ErrJournalCorrupt)
	case errors.Is(err, fs.ErrNotExist):
		if di, derr := os.Stat(filepath.Dir(path)); derr != nil {
			return nil, fmt.Errorf("open journal %s: %w: cannot create it: %w", path, ErrJournalWrite, derr)
		} else if !di.IsDir() {
			return nil, fmt.Errorf("open journal %s: %w: cannot create it: %s is not a directory", path, ErrJournalWrite, filepath.Dir(path))
		}
	case err != nil:
		return nil, fmt.Errorf("open journal %s: %w: %w", path, ErrJournalWrite, err)
	}
	if err == nil {
		f.modified = fi.ModTime()
	}
	if err := f.open(timeout); err != nil {
		return nil, fmt.Errorf("open journal %s: %w", path, err)
	}
	if err := f.init(); err != nil {
		_ = f.release()
		return nil, fmt.Errorf("open journal %s: %w", path, err)
	}
	if err := f.compactIfMostlyFree(); err != nil {
		_ = f.release()
		return nil, fmt.Errorf("open journal %s: %w", path, err)
	}
	return f, nil
}

// open opens the bbolt file, waiting up to timeout for its lock, and
// makes sure that the file it locked is still the one at the journal's
// path: another opener may have replaced it (compacted it) while this one
// waited. It then tries again with the file now at the path, within the
// same timeout.
func (f *boltFile) open(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if r, err := filepath.EvalSymlinks(f.path); err == nil {
			f.real = r
		}
		if err := f.openLocked(max(time.Until(deadline), time.Millisecond)); err != nil {
			return err
		}
		fi, err := os.Stat(f.path)
		if err == nil && os.SameFile(fi, f.id) {
			return nil
		}
		_ = f.release()
		if err == nil && time.Now().Before(deadline) {
			continue // replaced while this opener waited: lock the new file
		}
		if err == nil {
			return fmt.Errorf("%w: the journal file was replaced while this opener waited for its lock, and the new one stayed locked", ErrJournalLocked)
		}
		return fmt.Errorf("%w: the journal file was removed while this opener waited for its lock: %w", ErrJournalWrite, err)
	}
}

// openLocked opens f.real with bbolt and maps its errors to idem's
// sentinels. A damaged file can make bbolt panic or fault on its memory
// map; both are turned into ErrJournalCorrupt.
func (f *boltFile) openLocked(timeout time.Duration) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if f.file != nil {
				_ = f.file.Close()
			}
			f.db, err = nil, fmt.Errorf("%w: %v", ErrJournalCorrupt, p)
		}
	}()
	f.file = nil
	f.db, err = bolt.Open(f.real, 0o600, &bolt.Options{
		Timeout:      timeout,
		FreelistType: bolt.FreelistMapType,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			file, err := os.OpenFile(name, flag, perm)
			f.file = file
			return file, err
		},
	})
	if err != nil {
		return mapOpenError(err)
	}
	if f.id, err = f.file.Stat(); err != nil {
		_ = f.db.Close()
		return fmt.Errorf("%w: %w", ErrJournalWrite, err)
	}
	return nil
}

func mapOpenError(err error) error {
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("%w: %w", ErrJournalLocked, err)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
		errors.Is(err, berrors.ErrVersionMismatch), errors.Is(err, berrors.ErrInvalidMapping):
		return fmt.Errorf("%w: %w", ErrJournalCorrupt, err)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS),
		errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTDIR),
		errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: %w", ErrJournalWrite, err)
	}
	// bbolt reports most damage (a file shorter than its pages, a bad
	// page) with plain errors; anything else from opening an existing file
	// is damage too.
	return fmt.Errorf("%w: %w", ErrJournalCorrupt, err)
}

// init checks the size and format marker and creates the buckets of a new
// journal. A bbolt file with other buckets and no marker is foreign.
func (f *boltFile) init() error {
	// A file shorter than the pages its meta page claims was truncated;
	// reading those pages would fault.
	err := f.view(func(tx *bolt.Tx) error {
		if f.id.Size() < tx.Size() {
			return fmt.Errorf("%w: file is %d bytes, its pages need %d (truncated)", ErrJournalCorrupt, f.id.Size(), tx.Size())
		}
		return nil
	})
	if err != nil {
		return err
	}
	// An existing journal is only read here: Open writes nothing to it.
	ready := false
	err = f.view(func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		if m == nil {
			return nil
		}
		if err := checkFormat(m.Get(metaFormatKey)); err != nil {
			return err
		}
		ready = tx.Bucket(bucketOps) != nil && tx.Bucket(bucketNames) != nil
		return nil
	})
	if err != nil || ready {
		return err
	}
	return f.update(func(tx *bolt.Tx) error {
		if m := tx.Bucket(bucketMeta); m != nil {
			if err := checkFormat(m.Get(metaFormatKey)); err != nil {
				return err
			}
		} else {
			foreign := false
			_ = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
				foreign = true
				return errors.New("stop")
			})
			if foreign {
				return fmt.Errorf("%w: not an idem journal (no format marker)", ErrJournalCorrupt)
			}
			m, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			if err := m.Put(metaFormatKey, metaFormat); err != nil {
				return err
			}
		}
		for _, name := range [][]byte{bucketOps, bucketNames} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("%w: bucket %s: %w", ErrJournalCorrupt, name, err)
			}
		}
		return nil
	})
}

// checkFormat checks the journal's format marker: the current format is
// read; another idem format matches ErrRecordVersion and says what to do;
// anything else is damage.
func checkFormat(got []byte) error {
	if bytes.Equal(got, metaFormat) {
		return nil
	}
	v, ok := strings.CutPrefix(string(got), formatPrefix)
	switch {
	case !ok:
		return fmt.Errorf("%w: journal format marker %q, want %q", ErrJournalCorrupt, got, metaFormat)
	case v < string(metaFormat[len(formatPrefix):]) && len(v) <= len(metaFormat)-len(formatPrefix):
		return fmt.Errorf("%w: the journal has format %s, written by an earlier, unreleased version of idem that this one cannot read: "+
			"resume or reconcile its pending operations with the version that wrote it, then move the file away to start a new journal", ErrRecordVersion, got)
	}
	return fmt.Errorf("%w: the journal has format %s, written by a newer version of idem (this one reads %s): open it with that version", ErrRecordVersion, got, metaFormat)
}

// release closes the bbolt file. After bbolt panicked its locks may be
// held, so DB.Close would block forever: then only the file is closed,
// which releases the lock on it, and the memory map is left behind.
func (f *boltFile) release() error { return releaseDB(f.db, f.file, f.broken.Load()) }

func releaseDB(db *bolt.DB, file *os.File, broken bool) error {
	if broken {
		return file.Close()
	}
	return db.Close()
}

// corrupt turns the value bbolt panicked with (a damaged page) into an
// error matching ErrJournalCorrupt; after one, the store refuses all
// access.
func (f *boltFile) corrupt(p any) error {
	f.broken.Store(true)
	return fmt.Errorf("%w: a page of the journal file is damaged (bbolt: %v)", ErrJournalCorrupt, p)
}

// guarded runs fn with a fault or panic inside bbolt turned into
// ErrJournalCorrupt.
func (f *boltFile) guarded(fn func() error) (err error) {
	if f.broken.Load() {
		return fmt.Errorf("%w: an earlier access failed", ErrJournalCorrupt)
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			err = f.corrupt(p)
		}
	}()
	return fn()
}

// stillNamed returns an error matching ErrJournalWrite if the journal's
// path no longer names the open file (it was removed, renamed or
// replaced): a change written to an unlinked file would be lost.
func (f *boltFile) stillNamed() error {
	fi, err := os.Stat(f.path)
	if err == nil && os.SameFile(fi, f.id) {
		return nil
	}
	if err == nil {
		err = errors.New("the path names another file now")
	}
	return fmt.Errorf("%w: journal file %s was removed or replaced while open: %w", ErrJournalWrite, f.path, err)
}

// update runs fn in one durable bbolt transaction, guarded; a failed
// commit, and a journal whose file lost its name, become ErrJournalWrite.
func (f *boltFile) update(fn func(*bolt.Tx) error) error {
	return f.guarded(func() error {
		if err := f.stillNamed(); err != nil {
			return err
		}
		var fnErr error
		var id uint64
		// floor is read before the transaction begins: any transaction
		// that begins later has a higher ID, unless the file went back.
		floor := f.seenTx.Load()
		err := f.db.Update(func(tx *bolt.Tx) error {
			// A writable transaction's ID is the last committed one plus
			// one: it must be above every ID this handle had seen.
			if id = uint64(tx.ID()); id <= floor {
				fnErr = f.wentBack(id-1, floor)
				return fnErr
			}
			fnErr = fn(tx)
			return fnErr
		})
		if err == nil {
			f.sawTx(id)
		}
		if err != nil && fnErr == nil {
			if errors.Is(err, syscall.EFBIG) {
				// bbolt asked for pages far beyond the file: a damaged
				// free list or branch page does that.
				return fmt.Errorf("%w: %w: %w", ErrJournalWrite, ErrJournalCorrupt, err)
			}
			return fmt.Errorf("%w: %w", ErrJournalWrite, err)
		}
		return err
	})
}

// sawTx records that transaction id was committed.
func (f *boltFile) sawTx(id uint64) {
	for {
		old := f.seenTx.Load()
		if id <= old || f.seenTx.CompareAndSwap(old, id) {
			return
		}
	}
}

// wentBack returns the error for a file whose last transaction, id, is
// older than one this handle saw (seen): it was overwritten in place with an
// older copy (a restored backup), which has lost what was committed
// since. The store refuses all further access.
func (f *boltFile) wentBack(id, seen uint64) error {
	f.broken.Store(true)
	return fmt.Errorf("%w: journal file %s was overwritten with an older copy while open (its last transaction is %d, this process saw %d): "+
		"changes made since are lost; keep both files and reconcile the pending operations by their keys", ErrJournalCorrupt, f.path, id, seen)
}

// view runs fn in a read transaction, guarded.
func (f *boltFile) view(fn func(*bolt.Tx) error) error {
	return f.guarded(func() error {
		f.readers.RLock()
		defer f.readers.RUnlock()
		floor := f.seenTx.Load() // before the transaction begins, as in update
		err := f.db.View(func(tx *bolt.Tx) error {
			id := uint64(tx.ID())
			if id < floor {
				return f.wentBack(id, floor)
			}
			f.sawTx(id)
			return fn(tx)
		})
		if errors.Is(err, berrors.ErrDatabaseNotOpen) {
			return ErrClosed
		}
		return err
	})
}
