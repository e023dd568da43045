// Compaction at Open of a mostly free file.

package boltfile

import (
	"fmt"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
)

// Compaction at Open: a file of at least CompactMinSize bytes of which
// more than CompactFreeRatio is free pages (after a burst of traffic that
// retention has since swept) is rewritten into a new file that replaces it.
// They are variables only so that the crash-state harness can compact the
// small files of its workloads; nothing else changes them.
var (
	CompactMinSize   int64 = 16 << 20
	CompactFreeRatio       = 0.5
)

// compactIfMostlyFree rewrites a mostly free file into a new one and
// renames that over the file. The new file is opened, and its lock taken,
// before it gets the file's name, so no other opener can use it in
// between; f then holds the new file. A crash leaves either the old file
// or the complete new one under the name (and perhaps a leftover
// ".compact" file, removed by the next compaction). A path that is a
// symbolic link stays one: the file it names is replaced. If the
// directory's fsync after the rename fails, Open fails (Errors.Write):
// the compacted file keeps the name, and the next Open uses it.
func (f *File) compactIfMostlyFree() error {
	e := f.o.Errors
	st := f.db.Stats()
	ps := int64(f.db.Info().PageSize)
	size := f.id.Size()
	if size < CompactMinSize || float64(int64(st.FreePageN+st.PendingPageN)*ps) <= CompactFreeRatio*float64(size) {
		return nil
	}
	if f.o.BeforeCompact != nil {
		f.o.BeforeCompact()
	}
	tmp := f.real + ".compact"
	_ = os.Remove(tmp)
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{NoSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return fmt.Errorf("%w: compacting: %w", e.Write, err)
	}
	err = f.Guarded(func() error { return bolt.Compact(dst, f.db, 16<<20) })
	if err == nil {
		if err = dst.Sync(); err != nil {
			err = fmt.Errorf("%w: compacting: %w", e.Write, err)
		}
	}
	if cerr := dst.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("%w: compacting: %w", e.Write, cerr)
	}
	var nf *File
	if err == nil {
		nf = &File{o: f.o, path: tmp, real: tmp}
		if err = nf.openLocked(f.o.LockTimeout); err != nil {
			nf = nil
			err = fmt.Errorf("compacting: %w", err)
		}
	}
	if err == nil {
		if err = os.Rename(tmp, f.real); err != nil {
			err = fmt.Errorf("%w: compacting: %w", e.Write, err)
		}
	}
	if err != nil {
		if nf != nil {
			_ = nf.Release()
		}
		_ = os.Remove(tmp)
		return err
	}
	// The rename must be durable before the new file takes a write: a
	// power loss could otherwise bring back the old file under the name,
	// without what was committed to the new one since. The new file keeps
	// the name (it holds all the old one did), but this opener does not
	// use it.
	if err := syncDir(filepath.Dir(f.real), e); err != nil {
		_ = nf.Release()
		return fmt.Errorf("compacting: the rename of the compacted %s may not be durable: %w", f.o.Kind, err)
	}
	oldDB, oldFile := f.db, f.file
	f.db, f.file, f.id = nf.db, nf.file, nf.id
	f.seenTx.Store(0)
	if err := releaseDB(oldDB, oldFile, f.broken.Load()); err != nil {
		return fmt.Errorf("%w: closing the %s after compacting it: %w", e.Write, f.o.Kind, err)
	}
	return nil
}
