// Package codec encodes and decodes idem's journal records.
//
// A record is a leading version byte followed by the fields of that
// version. Version 1 writes strings and header values as a uvarint length
// followed by the bytes, integers and times as varints, and the fingerprint
// as 32 raw bytes. Request bodies are not part of a record: the journal keeps
// them in their own bucket so a large body is never copied by the codec.
//
// Decode never panics: truncated, damaged or trailing input is an error
// matching ErrCorrupt, and a version byte this package does not know is an
// error matching ErrVersion.
package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Version is the record version Append writes.
const Version byte = 1

var (
	// ErrVersion is returned by Decode when the record's version byte is not
	// one this package can read, typically because a newer version wrote it.
	ErrVersion = errors.New("codec: unknown record version")
	// ErrCorrupt is returned by Decode when the record is truncated, has
	// trailing bytes or a field that cannot be read.
	ErrCorrupt = errors.New("codec: corrupt record")
)

// Record is one journal record as the codec sees it. Times are Unix
// nanoseconds, with 0 meaning "not set". Header uses the same type as
// http.Header, so callers can convert without copying.
type Record struct {
	Key, Name, Method, URL, Host string
	Fingerprint                  [32]byte
	State                        uint8
	// Flags holds boolean properties of the operation, one bit each.
	Flags                        uint8
	Attempts, LastStatus         int64
	LastError                    string
	Created, Updated, LeaseUntil int64
	Owner                        string
	Header                       map[string][]string
}

// Size returns an upper bound of the encoded size of r, so a caller can
// allocate once.
func Size(r *Record) int {
	n := 1 + 32 + 2 + 5*binary.MaxVarintLen64 // version, fingerprint, state, flags, ints
	for _, s := range [...]string{r.Key, r.Name, r.Method, r.URL, r.Host, r.LastError, r.Owner} {
		n += binary.MaxVarintLen64 + len(s)
	}
	n += binary.MaxVarintLen64
	for k, vs := range r.Header {
		n += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	return n
}

// Append appends the encoding of r to dst and returns the extended slice.
// Header names are written in sorted order, so equal records encode to
// equal bytes.
func Append(dst []byte, r *Record) []byte {
	dst = slices.Grow(dst, Size(r))
	dst = append(dst, Version)
	dst = appendString(dst, r.Key)
	dst = appendString(dst, r.Name)
	dst = appendString(dst, r.Method)
	dst = appendString(dst, r.URL)
	dst = appendString(dst, r.Host)
	dst = append(dst, r.Fingerprint[:]...)
	dst = append(dst, r.State, r.Flags)
	dst = binary.AppendVarint(dst, r.Attempts)
	dst = binary.AppendVarint(dst, r.LastStatus)
	dst = appendString(dst, r.LastError)
	dst = binary.AppendVarint(dst, r.Created)
	dst = binary.AppendVarint(dst, r.Updated)
	dst = binary.AppendVarint(dst, r.LeaseUntil)
	dst = appendString(dst, r.Owner)
	dst = binary.AppendUvarint(dst, uint64(len(r.Header)))
	if len(r.Header) == 0 {
		return dst
	}
	var small [16]string
	names := small[:0]
	for k := range r.Header {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		vs := r.Header[k]
		dst = appendString(dst, k)
		dst = binary.AppendUvarint(dst, uint64(len(vs)))
		for _, v := range vs {
			dst = appendString(dst, v)
		}
	}
	return dst
}

// Encode returns the encoding of r in a new slice of the right capacity.
func Encode(r *Record) []byte { return Append(make([]byte, 0, Size(r)), r) }

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Decode decodes b into r, overwriting every field. r does not refer to b
// afterwards: b may be memory that is only valid inside a transaction.
// All strings of one record share a single allocation.
func Decode(b []byte, r *Record) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: empty", ErrCorrupt)
	}
	if b[0] != Version {
		return fmt.Errorf("%w %d (this version reads %d)", ErrVersion, b[0], Version)
	}
	d := decoder{s: string(b), off: 1}
	r.Key = d.str()
	r.Name = d.str()
	r.Method = d.str()
	r.URL = d.str()
	r.Host = d.str()
	if d.err == nil {
		if len(d.s)-d.off < 34 {
			d.fail("fingerprint")
		} else {
			copy(r.Fingerprint[:], d.s[d.off:d.off+32])
			r.State = d.s[d.off+32]
			r.Flags = d.s[d.off+33]
			d.off += 34
		}
	}
	r.Attempts = d.varint()
	r.LastStatus = d.varint()
	r.LastError = d.str()
	r.Created = d.varint()
	r.Updated = d.varint()
	r.LeaseUntil = d.varint()
	r.Owner = d.str()
	n := d.uvarint()
	r.Header = nil
	if d.err == nil && n > 0 {
		// Each header entry takes at least two bytes, which bounds n by the
		// input before anything is allocated.
		if n > uint64(len(d.s)-d.off)/2 {
			d.fail("header count")
		} else {
			r.Header = make(map[string][]string, n)
			for i := uint64(0); i < n && d.err == nil; i++ {
				k := d.str()
				m := d.uvarint()
				if d.err != nil {
					break
				}
				if m > uint64(len(d.s)-d.off) {
					d.fail("header value count")
					break
				}
				vs := make([]string, 0, m)
				for j := uint64(0); j < m && d.err == nil; j++ {
					vs = append(vs, d.str())
				}
				if _, dup := r.Header[k]; dup && d.err == nil {
					d.fail("duplicate header")
				}
				r.Header[k] = vs
			}
		}
	}
	if d.err == nil && d.off != len(d.s) {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return d.err
	}
	return nil
}

type decoder struct {
	s   string
	off int
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s at byte %d", ErrCorrupt, what, d.off)
	}
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	var x uint64
	var s uint
	for i := 0; i < binary.MaxVarintLen64; i++ {
		if d.off >= len(d.s) {
			d.fail("varint")
			return 0
		}
		c := d.s[d.off]
		d.off++
		if c < 0x80 {
			if i == binary.MaxVarintLen64-1 && c > 1 {
				d.fail("varint")
				return 0
			}
			return x | uint64(c)<<s
		}
		x |= uint64(c&0x7f) << s
		s += 7
	}
	d.fail("varint")
	return 0
}

func (d *decoder) varint() int64 {
	ux := d.uvarint()
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.s)-d.off) {
		d.fail("string length")
		return ""
	}
	s := d.s[d.off : d.off+int(n)]
	d.off += int(n)
	return s
}
