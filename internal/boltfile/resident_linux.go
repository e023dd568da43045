package boltfile

import (
	"syscall"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

// Unmap lets the kernel take back the file's pages this process has
// mapped, without dropping them from the page cache or changing the file:
// after an Open that walked one bucket, the kernel's fault-around has
// mapped the neighbouring pages of every page read (up to 64 KiB each),
// and they would stay in the process's RSS. Later reads map what they
// touch again. bbolt writes through the file, never the mapping, so there
// is nothing to lose. Errors are ignored: it is advice.
func (f *File) Unmap() {
	_ = f.View(func(tx *bolt.Tx) error {
		info := tx.DB().Info()
		size := tx.Size()
		if info == nil || size <= 0 {
			return nil
		}
		data := unsafe.Slice(*(**byte)(unsafe.Pointer(&info.Data)), int(size))
		_ = syscall.Madvise(data, syscall.MADV_DONTNEED)
		return nil
	})
}
