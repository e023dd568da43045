//go:build !linux

package boltfile

// Unmap does nothing outside Linux, where the kernel maps no pages around
// the ones a read faults in.
func (f *File) Unmap() {}
