// Package readall reads a body into memory up to a bound, as
// io.ReadAll(io.LimitReader(r, n)) does, without the LimitedReader and
// into a buffer the caller may have sized and prefixed.
package readall

import "io"

// Append reads r into b, after what b holds, until r ends or b holds end
// bytes, whichever comes first, and returns the grown buffer. A read
// error other than io.EOF is returned with what was read before it. b's
// capacity is used first; append grows it beyond.
func Append(b []byte, r io.Reader, end int64) ([]byte, error) {
	for int64(len(b)) < end {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // let append grow the buffer
		}
		m, err := r.Read(b[len(b):min(int64(cap(b)), end)])
		b = b[:len(b)+m]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
	return b, nil
}
