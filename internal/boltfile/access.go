// Access to an open file: transactions, the fault guard, the checks that
// the file still has its name and has not gone back, release.

package boltfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
	"strings"
	"syscall"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Release closes the bbolt file. After bbolt panicked its locks may be
// held, so DB.Close would block forever: then only the file is closed,
// which releases the lock on it, and the memory map is left behind.
func (f *File) Release() error { return releaseDB(f.db, f.file, f.broken.Load()) }

// ReleaseAfterRead closes the file in full, unmapped too, even after a
// fault: for a file on which only read transactions ran since it was
// opened (a read transaction that panicked rolled back and holds no lock).
func (f *File) ReleaseAfterRead() error { return releaseDB(f.db, f.file, false) }

func releaseDB(db *bolt.DB, file *os.File, broken bool) error {
	if broken {
		return file.Close()
	}
	return db.Close()
}

// Broken reports whether an access faulted or found the file gone back:
// the File then refuses all access.
func (f *File) Broken() bool { return f.broken.Load() }

// Corrupt turns the value bbolt panicked with (a damaged page) into an
// error matching Corrupt; after one, the File refuses all access. It is
// a groupcommit.Options.Recover.
func (f *File) Corrupt(p any) error {
	f.broken.Store(true)
	return f.damaged(p)
}

// damaged turns the value bbolt panicked with into an error matching
// Corrupt, without marking the File broken.
func (f *File) damaged(p any) error {
	return fmt.Errorf("%w: a page of the %s file is damaged (bbolt: %v)", f.o.Errors.Corrupt, f.o.Kind, p)
}

// Guarded runs fn with a fault or panic inside bbolt turned into Corrupt
// (see Corrupt).
func (f *File) Guarded(fn func() error) (err error) {
	if f.broken.Load() {
		return fmt.Errorf("%w: an earlier access failed", f.o.Errors.Corrupt)
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			err = f.Corrupt(p)
		}
	}()
	return fn()
}

// StillNamed returns an error matching Write if the path no longer names
// the open file (it was removed, renamed or replaced): a change written
// to an unlinked file would be lost.
func (f *File) StillNamed() error {
	fi, err := os.Stat(f.path)
	if err == nil && os.SameFile(fi, f.id) {
		return nil
	}
	if err == nil {
		err = errors.New("the path names another file now")
	}
	return fmt.Errorf("%w: %s file %s was removed or replaced while open: %w", f.o.Errors.Write, f.o.Kind, f.path, err)
}

// Update runs fn in one durable bbolt transaction, guarded, after checking
// that the path still names the file; a transaction ID that went back is
// Corrupt. fn's own error is returned as is.
//
// A failed commit (a write, fdatasync or file growth that failed): bbolt
// rolls back only its memory. Its error matches Unknown when the file, as
// this process reads it (the page cache, through bbolt's memory map),
// holds the commit's meta page, so that it may be durable or become so;
// bbolt's memory no longer matches the file then, and the File refuses
// every later Update (an error matching Write) until it is opened again,
// which checks the file. A commit that failed before its meta page was
// written matches Write: nothing of it is durable. After one the File
// refuses writes too, unless the disk was only full (a write or file
// growth refused with ENOSPC or EDQUOT: the next commit, which writes
// every page it needs again, may succeed): after a failed fsync or an I/O
// error the kernel may have dropped or kept the pages it could not write
// (fsyncgate), and nothing about the file is trusted.
func (f *File) Update(fn func(*bolt.Tx) error) error {
	e := f.o.Errors
	return f.Guarded(func() error {
		if p := f.failed.Load(); p != nil {
			return fmt.Errorf("%w: an earlier commit of the %s failed (%v): it refuses writes until it is opened again", e.Write, f.o.Kind, *p)
		}
		if err := f.StillNamed(); err != nil {
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
				return fmt.Errorf("%w: %w: %w", e.Write, e.Corrupt, err)
			}
			if f.reached(id) {
				f.failed.CompareAndSwap(nil, &err)
				return fmt.Errorf("%w: the %s's commit failed after its meta page reached the file, so it may be durable; "+
					"the %[2]s refuses writes until it is opened again: %w", e.Unknown, f.o.Kind, err)
			}
			if !isFull(err) {
				f.failed.CompareAndSwap(nil, &err)
				return fmt.Errorf("%w: the %s's commit failed before its meta page was written (nothing of it is durable); "+
					"the %[2]s refuses writes until it is opened again: %w", e.Write, f.o.Kind, err)
			}
			return fmt.Errorf("%w: %w", e.Write, err)
		}
		return err
	})
}

// reached reports whether the file, as this process reads it, holds a
// valid meta page of transaction id or later: whether a commit that
// failed may be durable. An unreadable file may be anything: true.
func (f *File) reached(id uint64) bool {
	at := uint64(0)
	err := f.db.View(func(tx *bolt.Tx) error {
		at = uint64(tx.ID())
		return nil
	})
	return err != nil || at >= id
}

// isFull reports whether err is a write or file growth refused for want
// of space (ENOSPC, EDQUOT, or any failure of bbolt's growth of the file,
// which comes before the commit writes anything), the one failure after
// which the File goes on: bbolt returns fdatasync's errno bare, and a
// failed write or *os.File.Sync as a PathError of its op.
func isFull(err error) bool {
	if strings.HasPrefix(err.Error(), "file resize error") {
		// bbolt's growth of the file (truncate, then fsync), before any
		// page is written, formatted without wrapping: EFBIG, ENOSPC.
		return true
	}
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe.Op == "sync" {
		return false
	}
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Failed returns the error of the commit that failed, after which the
// File refuses writes, or nil.
func (f *File) Failed() error {
	if p := f.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// View runs fn in a read transaction, guarded; a transaction ID below one
// this handle saw is Corrupt (the file went back), a released file Closed.
func (f *File) View(fn func(*bolt.Tx) error) error {
	return f.Guarded(func() error {
		f.readers.RLock()
		defer f.readers.RUnlock()
		floor := f.seenTx.Load() // before the transaction begins, as in Update
		err := f.db.View(func(tx *bolt.Tx) error {
			id := uint64(tx.ID())
			if id < floor {
				return f.wentBack(id, floor)
			}
			f.sawTx(id)
			return fn(tx)
		})
		if errors.Is(err, berrors.ErrDatabaseNotOpen) {
			return f.o.Errors.Closed
		}
		return err
	})
}

// Salvage runs fn in a read transaction with bbolt's panics and faults
// turned into Corrupt, without marking the File broken (a read transaction
// holds no lock bbolt would leave behind): for tools that read what they
// can of a damaged file.
func (f *File) Salvage(fn func(*bolt.Tx) error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			err = f.damaged(p)
		}
	}()
	f.readers.RLock()
	defer f.readers.RUnlock()
	return f.db.View(fn)
}

// HoldReaders holds off read transactions (View, Salvage) until the
// returned function is called: for a caller that overwrites free pages,
// which a reader's snapshot may still use.
func (f *File) HoldReaders() (release func()) {
	f.readers.Lock()
	return f.readers.Unlock
}

// WriteAt writes b to the file at off, behind bbolt's back: for a caller
// that overwrites free pages inside a write transaction with HoldReaders
// held. The bytes reach the disk with that transaction's commit.
func (f *File) WriteAt(b []byte, off int64) (int, error) { return f.file.WriteAt(b, off) }

// sawTx records that transaction id was committed.
func (f *File) sawTx(id uint64) {
	for {
		old := f.seenTx.Load()
		if id <= old || f.seenTx.CompareAndSwap(old, id) {
			return
		}
	}
}

// wentBack returns the error for a file whose last transaction, id, is
// older than one this handle saw (seen): it was overwritten in place with
// an older copy (a restored backup), which has lost what was committed
// since. The File refuses all further access.
func (f *File) wentBack(id, seen uint64) error {
	f.broken.Store(true)
	return fmt.Errorf("%w: %s file %s was overwritten with an older copy while open (its last transaction is %d, this process saw %d): "+
		"changes made since are lost; keep both files and reconcile their records by key", f.o.Errors.Corrupt, f.o.Kind, f.path, id, seen)
}
