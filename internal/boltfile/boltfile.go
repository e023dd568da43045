// Package boltfile is the bbolt file handling shared by idem's journal
// (package boltjournal's Store) and idemserver's BoltStore: opening and
// locking the file at a path (the one at the path, links followed), the
// empty, truncated and foreign file checks, the format marker, compaction
// of a mostly free file at Open, the checks that the file still has its
// name and has not gone back to an older copy, the guard that turns a
// fault or panic on a damaged memory map into an error, and the mapping of
// bbolt's errors to the caller's sentinels.
//
// The records and buckets stay the caller's: a File knows only the meta
// bucket that holds the format marker and the names of the buckets a
// ready file has.
package boltfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Errors are the caller's sentinels that a File's errors match. Every
// field must be set.
type Errors struct {
	// Locked: another process or handle held the file past the lock
	// timeout.
	Locked error
	// Corrupt: the file is damaged, truncated, emptied, foreign, went back
	// to an older copy, or a page faulted.
	Corrupt error
	// Write: the file cannot be created, opened for writing or written, or
	// its path no longer names it; or a commit failed for certain before
	// any of it could reach the file's meta page (nothing of it is
	// durable, or ever will be), or the File refuses writes after a failed
	// commit.
	Write error
	// Unknown: a commit failed after its meta page reached the file (an
	// fdatasync that failed, EIO on the meta page): it may be durable or
	// not, now or after a crash. It must not match Write.
	Unknown error
	// Closed: a transaction on a released file.
	Closed error
}

// Options say what file a caller opens. Kind, Foreign, Errors, Meta,
// FormatKey and Marker must be set.
type Options struct {
	// Kind names the file in messages: "journal", "store".
	Kind string
	// Foreign is what a bbolt file without the marker is not, for its
	// error: "an idem journal".
	Foreign string
	// Errors are the sentinels the errors match.
	Errors Errors
	// LockTimeout bounds the wait for the file's lock, a replaced file's
	// included. Zero or less means 2 seconds.
	LockTimeout time.Duration
	// Meta is the bucket that holds the format marker under FormatKey;
	// Marker is what a new file gets.
	Meta, FormatKey, Marker []byte
	// CheckFormat checks an existing file's marker (nil if its meta bucket
	// lacks one). Nil means it must equal Marker, or the file is Corrupt.
	CheckFormat func(marker []byte) error
	// Buckets are the buckets of a ready file: Open creates those a new
	// file lacks.
	Buckets [][]byte
	// Compact makes Open rewrite a mostly free file (see Compact).
	Compact bool
	// ReadOnly opens an existing file for reading only, under a shared
	// lock: nothing is written, not even to a damaged file. Compact is
	// ignored, a missing file is not created, and a file without the
	// marker or one of Buckets is Corrupt.
	ReadOnly bool
	// BucketsRequired makes a writable Open refuse (Corrupt), rather than
	// create, a bucket of Buckets that an existing file with the marker
	// lacks: for files whose buckets all came with the marker, where a
	// missing one was lost. A new file gets them all.
	BucketsRequired bool
	// BeforeCompact, if set, runs when Open has decided to compact, with
	// the lock held (a test hook).
	BeforeCompact func()
}

// File is an open bbolt file and what guards it. Its methods are safe for
// concurrent use.
type File struct {
	o        Options
	path     string // as given (perhaps a symbolic link)
	real     string // the file it names, links resolved: what is opened and compacted
	modified time.Time
	db       *bolt.DB
	file     *os.File    // bbolt's file handle, to release a broken file
	id       os.FileInfo // the open file, to tell whether path still names it
	broken   atomic.Bool // bbolt panicked or faulted; its locks may be held
	// failed is the first commit error: after it the File refuses writes
	// (see Update).
	failed atomic.Pointer[error]

	// readers is held shared by read transactions and exclusively by
	// HoldReaders.
	readers sync.RWMutex
	// seenTx is the highest bbolt transaction ID this handle has seen
	// committed. IDs only grow: a lower one means the file was overwritten
	// in place with an older copy.
	seenTx atomic.Uint64
}

// DefaultLockTimeout is the lock timeout of a zero Options.LockTimeout.
const DefaultLockTimeout = 2 * time.Second

// Open opens, or creates (mode 0600), the bbolt file at path and checks
// its size and format. Only a missing file creates one: an existing empty
// or short file lost its contents (Corrupt). An existing file is only read
// here, unless it is compacted or lacks one of its buckets.
//
// One opener at a time: after taking the lock, Open checks that the locked
// file is still the one at the path (another opener may have compacted and
// replaced it meanwhile) and otherwise waits for the new one. A path that
// is a symbolic link is followed, and stays a link.
//
// Errors do not name the path: the caller's wrapping does.
func Open(path string, o Options) (*File, error) {
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	e := o.Errors
	f := &File{o: o, path: path, real: path}
	if path == "" {
		return nil, fmt.Errorf("%w: empty path", e.Write)
	}
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return nil, fmt.Errorf("%w: the path is a directory", e.Write)
	case err == nil && fi.Size() == 0:
		return nil, fmt.Errorf("%w: the file is empty: a %s that lost its contents, not a new one (remove it to start a new %[2]s)", e.Corrupt, o.Kind)
	case errors.Is(err, fs.ErrNotExist):
		if di, derr := os.Stat(filepath.Dir(path)); derr != nil {
			return nil, fmt.Errorf("%w: cannot create it: %w", e.Write, derr)
		} else if !di.IsDir() {
			return nil, fmt.Errorf("%w: cannot create it: %s is not a directory", e.Write, filepath.Dir(path))
		}
	case err != nil:
		return nil, fmt.Errorf("%w: %w", e.Write, err)
	}
	if err == nil {
		f.modified = fi.ModTime()
	} else if err := create(path, o); err != nil {
		return nil, err
	}
	if err := f.open(); err != nil {
		if errors.Is(err, e.Corrupt) {
			if why := unborn(f.real); why != "" {
				return nil, fmt.Errorf("%w: %s", err, why)
			}
		}
		return nil, err
	}
	if err := f.init(); err != nil {
		_ = f.Release()
		return nil, err
	}
	if o.Compact && !o.ReadOnly {
		if err := f.compactIfMostlyFree(); err != nil {
			_ = f.Release()
			return nil, err
		}
	}
	return f, nil
}

// create makes the file at path, whole: it initialises a file under a
// temporary name in the same directory (bbolt's first pages, then the
// buckets and format marker, each fsynced by bbolt), links it to path,
// which fails if another opener made one first (that one is used), and
// fsyncs the directory, so that the name is durable before the caller can
// journal anything in the file. A crash leaves at most a temporary file
// behind (named path.new-*), never used again.
func create(path string, o Options) error {
	e := o.Errors
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".new-*")
	if err != nil {
		return fmt.Errorf("%w: cannot create it: %w", e.Write, err)
	}
	name := tmp.Name()
	_ = tmp.Close()
	defer os.Remove(name)
	nf := &File{o: o, path: name, real: name}
	nf.o.Compact = false
	if err := nf.openLocked(o.LockTimeout); err != nil {
		return err
	}
	err = nf.init()
	if rerr := nf.Release(); err == nil && rerr != nil {
		err = fmt.Errorf("%w: %w", e.Write, rerr)
	}
	if err != nil {
		return err
	}
	if err := os.Link(name, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: cannot create it: %w", e.Write, err)
	}
	_ = os.Remove(name)
	return syncDir(dir, e)
}

// syncDir fsyncs dir, so that the names made or changed in it are durable.
func syncDir(dir string, e Errors) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("%w: open its directory to sync it: %w", e.Write, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%w: sync its directory: %w", e.Write, err)
	}
	return nil
}

// unborn says why a file bbolt refused never held a record, or "": a file
// of at most bbolt's first four pages (a file grows past them at its first
// commit, before that commit's meta page is written) without a valid meta
// page of a commit (transaction 2 or later) was being created when the
// machine stopped, by a release of idem that created files in place.
func unborn(path string) string {
	b, err := os.ReadFile(path)
	ps := os.Getpagesize()
	if err != nil || len(b) > 4*ps {
		return ""
	}
	for _, off := range []int{0, ps} {
		if off+80 <= len(b) && validMeta(b[off:off+80]) && binary.LittleEndian.Uint64(b[off+64:]) >= 2 {
			return ""
		}
	}
	return fmt.Sprintf("the file (%d bytes) never completed its first commit: it was being created when the machine stopped, "+
		"so no key was ever journaled in it; remove it to start a new one", len(b))
}

// validMeta reports whether m (the first 80 bytes of a bbolt meta page)
// has bbolt's magic and a valid checksum: page header (16 bytes), then
// magic, version, page size, flags (4 each), root bucket (16), freelist,
// pgid, txid (8 each) and checksum, FNV-64a of the meta's bytes before it.
func validMeta(m []byte) bool {
	const magic = 0xED0CDAED
	if binary.LittleEndian.Uint32(m[16:]) != magic {
		return false
	}
	h := fnv.New64a()
	h.Write(m[16:72])
	return h.Sum64() == binary.LittleEndian.Uint64(m[72:])
}

// Modified returns the file's modification time when Open found it, or
// the zero time for a new file.
func (f *File) Modified() time.Time { return f.modified }

// open opens the bbolt file, waiting up to the lock timeout, and makes
// sure that the file it locked is still the one at the path: another
// opener may have replaced it (compacted it) while this one waited. It
// then tries again with the file now at the path, within the same
// timeout.
func (f *File) open() error {
	e := f.o.Errors
	deadline := time.Now().Add(f.o.LockTimeout)
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
		_ = f.Release()
		if err == nil && time.Now().Before(deadline) {
			continue // replaced while this opener waited: lock the new file
		}
		if err == nil {
			return fmt.Errorf("%w: the %s file was replaced while this opener waited for its lock, and the new one stayed locked", e.Locked, f.o.Kind)
		}
		return fmt.Errorf("%w: the %s file was removed while this opener waited for its lock: %w", e.Write, f.o.Kind, err)
	}
}

// openLocked opens f.real with bbolt and maps its errors. A damaged file
// can make bbolt panic or fault on its memory map; both are Corrupt.
func (f *File) openLocked(timeout time.Duration) (err error) {
	e := f.o.Errors
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if f.file != nil {
				_ = f.file.Close()
			}
			f.db, err = nil, fmt.Errorf("%w: %v", e.Corrupt, p)
		}
	}()
	f.file = nil
	f.db, err = bolt.Open(f.real, 0o600, &bolt.Options{
		Timeout:      timeout,
		ReadOnly:     f.o.ReadOnly,
		FreelistType: bolt.FreelistMapType,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			file, err := os.OpenFile(name, flag, perm)
			f.file = file
			return file, err
		},
	})
	if err != nil {
		return MapOpenError(err, e)
	}
	if f.id, err = f.file.Stat(); err != nil {
		_ = f.db.Close()
		return fmt.Errorf("%w: %w", e.Write, err)
	}
	return nil
}

// MapOpenError maps an error of bolt.Open to e's sentinels: a lock
// timeout is Locked; permissions, a read-only or full file system, a
// missing file or directory are Write; anything else is damage (bbolt
// reports most damage, a file shorter than its pages or a bad page, with
// plain errors), Corrupt.
func MapOpenError(err error, e Errors) error {
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("%w: %w", e.Locked, err)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
		errors.Is(err, berrors.ErrVersionMismatch), errors.Is(err, berrors.ErrInvalidMapping):
		return fmt.Errorf("%w: %w", e.Corrupt, err)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS),
		errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTDIR),
		errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: %w", e.Write, err)
	}
	return fmt.Errorf("%w: %w", e.Corrupt, err)
}

// init checks the size and format marker and creates the buckets of a new
// file. A bbolt file with other buckets and no marker is foreign.
func (f *File) init() error {
	o, e := f.o, f.o.Errors
	// A file shorter than the pages its meta page claims was truncated;
	// reading those pages would fault.
	err := f.View(func(tx *bolt.Tx) error {
		if f.id.Size() < tx.Size() {
			return fmt.Errorf("%w: file is %d bytes, its pages need %d (truncated)", e.Corrupt, f.id.Size(), tx.Size())
		}
		return nil
	})
	if err != nil {
		return err
	}
	// An existing file is only read here.
	ready := false
	err = f.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(o.Meta)
		if m == nil {
			return nil
		}
		if err := f.checkFormat(m.Get(o.FormatKey)); err != nil {
			return err
		}
		ready = true
		for _, name := range o.Buckets {
			ready = ready && tx.Bucket(name) != nil
		}
		return nil
	})
	if err != nil || ready {
		return err
	}
	if o.ReadOnly || o.BucketsRequired {
		err := f.View(func(tx *bolt.Tx) error {
			if tx.Bucket(o.Meta) == nil {
				if !o.ReadOnly {
					return nil // a new file, or a foreign one: the Update below tells
				}
				return fmt.Errorf("%w: not %s (no format marker)", e.Corrupt, o.Foreign)
			}
			for _, name := range o.Buckets {
				if tx.Bucket(name) == nil {
					return fmt.Errorf("%w: the %s file has its format marker but no %s bucket: it is damaged", e.Corrupt, o.Kind, name)
				}
			}
			return nil
		})
		if err != nil || o.ReadOnly {
			return err
		}
	}
	return f.Update(func(tx *bolt.Tx) error {
		if m := tx.Bucket(o.Meta); m != nil {
			if err := f.checkFormat(m.Get(o.FormatKey)); err != nil {
				return err
			}
		} else {
			if k, _ := tx.Cursor().First(); k != nil {
				return fmt.Errorf("%w: not %s (no format marker)", e.Corrupt, o.Foreign)
			}
			m, err := tx.CreateBucket(o.Meta)
			if err != nil {
				return fmt.Errorf("%w: bucket %s: %w", e.Corrupt, o.Meta, err)
			}
			if err := m.Put(o.FormatKey, o.Marker); err != nil {
				return fmt.Errorf("%w: %w", e.Write, err)
			}
		}
		for _, name := range o.Buckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("%w: bucket %s: %w", e.Corrupt, name, err)
			}
		}
		return nil
	})
}

func (f *File) checkFormat(got []byte) error {
	if f.o.CheckFormat != nil {
		return f.o.CheckFormat(got)
	}
	if !bytes.Equal(got, f.o.Marker) {
		return fmt.Errorf("%w: %s format marker %q, want %q", f.o.Errors.Corrupt, f.o.Kind, got, f.o.Marker)
	}
	return nil
}
