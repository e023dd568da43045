// Compaction at Open of a mostly free journal.

package idem

import (
	"fmt"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
)

// Compaction at Open: a journal of at least compactMinSize bytes of which
// more than compactFreeRatio is free pages (after a burst of traffic that
// retention has since swept) is rewritten into a new file that replaces it.
const (
	compactMinSize   = 16 << 20
	compactFreeRatio = 0.5
)

// compactIfMostlyFree rewrites a mostly free journal into a new file and
// renames that over the journal's file. The new file is opened, and its
// lock taken, before it gets the journal's name, so no other opener can
// use it in between; f then holds the new file. A crash leaves either the
// old file or the complete new one under the journal's name (and perhaps
// a leftover ".compact" file, removed by the next compaction). A journal
// path that is a symbolic link stays one: the file it names is replaced.
func (f *boltFile) compactIfMostlyFree() error {
	st := f.db.Stats()
	ps := int64(f.db.Info().PageSize)
	size := f.id.Size()
	if size < compactMinSize || float64(int64(st.FreePageN+st.PendingPageN)*ps) <= compactFreeRatio*float64(size) {
		return nil
	}
	if f.beforeCompact != nil {
		f.beforeCompact()
	}
	tmp := f.real + ".compact"
	_ = os.Remove(tmp)
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{NoSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return fmt.Errorf("%w: compacting: %w", ErrJournalWrite, err)
	}
	err = f.guarded(func() error { return bolt.Compact(dst, f.db, 16<<20) })
	if err == nil {
		if err = dst.Sync(); err != nil {
			err = fmt.Errorf("%w: compacting: %w", ErrJournalWrite, err)
		}
	}
	if cerr := dst.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("%w: compacting: %w", ErrJournalWrite, cerr)
	}
	var nf *boltFile
	if err == nil {
		nf = &boltFile{path: tmp, real: tmp}
		if err = nf.openLocked(f.timeout); err != nil {
			nf = nil
			err = fmt.Errorf("compacting: %w", err)
		}
	}
	if err == nil {
		if err = os.Rename(tmp, f.real); err != nil {
			err = fmt.Errorf("%w: compacting: %w", ErrJournalWrite, err)
		}
	}
	if err != nil {
		if nf != nil {
			_ = nf.release()
		}
		_ = os.Remove(tmp)
		return err
	}
	if d, err := os.Open(filepath.Dir(f.real)); err == nil {
		_ = d.Sync() // make the rename durable
		_ = d.Close()
	}
	oldDB, oldFile := f.db, f.file
	f.db, f.file, f.id = nf.db, nf.file, nf.id
	f.seenTx.Store(0)
	if err := releaseDB(oldDB, oldFile, f.broken.Load()); err != nil {
		return fmt.Errorf("%w: closing the journal after compacting it: %w", ErrJournalWrite, err)
	}
	return nil
}
