// Package codec encodes and decodes idem's journal records.
//
// A record is the value stored under an operation's key; the key itself is
// not repeated in it. Version 2 is:
//
//	version   1 byte (2, or 3 with the extension below)
//	state     1 byte
//	flags     1 byte (bits 6 and 7 are the codec's own: a key header
//	          follows the owner; a lease time follows)
//	created   varint, Unix nanoseconds (0: not set)
//	updated   varint, nanoseconds after created
//	lease     varint, nanoseconds after created (only with flag bit 7)
//	attempts  uvarint
//	status    uvarint
//	fingerprint 32 bytes
//	name, method, URL, host, last error, owner: uvarint length + bytes each
//	key header uvarint length + bytes (only with flag bit 6)
//	--- the extension, only in version 3 ---
//	trace     uvarint length + bytes
//	history   uvarint count, then per attempt: at (varint, nanoseconds
//	          after created), sent, status (uvarints), error and reason
//	          (uvarint length + bytes each)
//	--- the request section, empty in a finished record ---
//	header count uvarint, then per header: name, value count, values
//	body      the remaining bytes
//	crc       4 bytes, CRC-32C (Castagnoli) of everything before, little endian
//
// Version 3 is version 2 with the extension: a record with neither a
// trace nor a history is written as version 2, byte for byte as before
// the extension existed, and records of version 2 read with neither. A
// reader that knows only version 2 reports a version 3 record as written
// by a newer version, never as damaged.
//
// Every version, this one and any later one, ends in that checksum: a
// record whose version byte is unknown but whose checksum holds was
// written by a newer version (ErrVersion); one whose checksum fails is
// damaged (ErrCorrupt), whatever its first byte says.
//
// A finished record has no request section beyond a zero header count, so
// it is about 100 bytes plus its URL, name and owner. The checksum lets a
// reader tell a damaged record (or a damaged page holding it) from a valid
// one: bbolt checks no page contents.
//
// Decoding never panics: truncated, damaged or trailing input is an error
// matching ErrCorrupt, and a version byte this package does not know is an
// error matching ErrVersion.
package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"unsafe"
)

// Version is the record version Append writes for a record without a
// trace or history; VersionExt the one it writes for a record with
// either. Both are read.
const (
	Version    byte = 2
	VersionExt byte = 3
)

var (
	// ErrVersion is returned by Decode when the record's version byte is not
	// one this package can read.
	ErrVersion = errors.New("codec: unknown record version")
	// ErrCorrupt is returned by Decode when the record is truncated, fails
	// its checksum, has trailing bytes or a field that cannot be read.
	ErrCorrupt = errors.New("codec: corrupt record")
)

// Record is one journal record as the codec sees it. Times are Unix
// nanoseconds, with 0 meaning "not set" (LeaseUntil only; Created and
// Updated are always written). Header uses the same type as http.Header, so
// callers can convert without copying.
type Record struct {
	Name, Method, URL, Host string
	Fingerprint             [32]byte
	State                   uint8
	// Flags holds boolean properties of the operation, one bit each; bits
	// 6 and 7 are reserved for the codec.
	Flags                        uint8
	Attempts, LastStatus         int64
	LastError                    string
	Created, Updated, LeaseUntil int64
	Owner                        string
	// KeyHeader is the header the key travels in, "" for the default. It
	// is written only when set, so a record without it encodes as records
	// written before it existed.
	KeyHeader string
	// Trace and History are the extension of version 3: the operation's
	// W3C traceparent and its recorded attempts, oldest first.
	Trace   string
	History []Attempt
	Header  map[string][]string
	Body    []byte
}

// Attempt is one entry of a record's history. At is Unix nanoseconds.
type Attempt struct {
	At, Sent, Status int64
	Err, Reason      string
}

// ext reports whether r needs the extension (version 3).
func (r *Record) ext() bool { return r.Trace != "" || len(r.History) > 0 }

const (
	flagLease     = 1 << 7 // a lease time follows; codec-internal
	flagKeyHeader = 1 << 6 // a key header follows the owner; codec-internal
	codecFlags    = flagLease | flagKeyHeader
	crcSize       = 4
	// minSize is the shortest valid record: the three leading bytes, the
	// smallest varints, the fingerprint, six empty strings, a zero header
	// count and the checksum.
	minSize = 3 + 1 + 1 + 1 + 1 + 32 + 6 + 1 + crcSize
)

var table = crc32.MakeTable(crc32.Castagnoli)

// Size returns an upper bound of the encoded size of r, so a caller can
// allocate once.
func Size(r *Record) int {
	return HeadSize(r) + RequestSize(r.Header, r.Body)
}

// HeadSize returns an upper bound of the encoded size of r without its
// request section, checksum included.
func HeadSize(r *Record) int {
	n := 3 + 5*binary.MaxVarintLen64 + 32 + crcSize
	for _, s := range [...]string{r.Name, r.Method, r.URL, r.Host, r.LastError, r.Owner, r.KeyHeader} {
		n += binary.MaxVarintLen64 + len(s)
	}
	if r.ext() {
		n += 2*binary.MaxVarintLen64 + len(r.Trace)
		for _, a := range r.History {
			n += 5*binary.MaxVarintLen64 + len(a.Err) + len(a.Reason)
		}
	}
	return n
}

// RequestSize returns an upper bound of the encoded size of a request
// section holding header and body.
func RequestSize(header map[string][]string, body []byte) int {
	n := binary.MaxVarintLen64 + len(body)
	for k, vs := range header {
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
	start := len(dst)
	dst = appendHead(dst, r)
	dst = AppendRequest(dst, r.Header, r.Body)
	return appendCRC(dst, start)
}

// AppendWithRequest is Append with r's request section replaced by req, a
// section returned by DecodeHead (or made by AppendRequest), copied as it
// is.
func AppendWithRequest(dst []byte, r *Record, req []byte) []byte {
	dst = slices.Grow(dst, HeadSize(r)+len(req))
	start := len(dst)
	dst = appendHead(dst, r)
	if len(req) == 0 {
		dst = append(dst, 0)
	} else {
		dst = append(dst, req...)
	}
	return appendCRC(dst, start)
}

// Encode returns the encoding of r in a new slice of the right capacity.
func Encode(r *Record) []byte { return Append(make([]byte, 0, Size(r)), r) }

func appendHead(dst []byte, r *Record) []byte {
	flags := r.Flags &^ codecFlags
	if r.LeaseUntil != 0 {
		flags |= flagLease
	}
	if r.KeyHeader != "" {
		flags |= flagKeyHeader
	}
	version := Version
	if r.ext() {
		version = VersionExt
	}
	dst = append(dst, version, r.State, flags)
	dst = binary.AppendVarint(dst, r.Created)
	dst = binary.AppendVarint(dst, r.Updated-r.Created)
	if r.LeaseUntil != 0 {
		dst = binary.AppendVarint(dst, r.LeaseUntil-r.Created)
	}
	dst = binary.AppendUvarint(dst, uint64(r.Attempts))
	dst = binary.AppendUvarint(dst, uint64(r.LastStatus))
	dst = append(dst, r.Fingerprint[:]...)
	dst = appendString(dst, r.Name)
	dst = appendString(dst, r.Method)
	dst = appendString(dst, r.URL)
	dst = appendString(dst, r.Host)
	dst = appendString(dst, r.LastError)
	dst = appendString(dst, r.Owner)
	if r.KeyHeader != "" {
		dst = appendString(dst, r.KeyHeader)
	}
	if version == VersionExt {
		dst = appendString(dst, r.Trace)
		dst = binary.AppendUvarint(dst, uint64(len(r.History)))
		for _, a := range r.History {
			dst = binary.AppendVarint(dst, a.At-r.Created)
			dst = binary.AppendUvarint(dst, uint64(a.Sent))
			dst = binary.AppendUvarint(dst, uint64(a.Status))
			dst = appendString(dst, a.Err)
			dst = appendString(dst, a.Reason)
		}
	}
	return dst
}

// AppendRequest appends a request section holding header and body.
func AppendRequest(dst []byte, header map[string][]string, body []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(header)))
	if len(header) > 0 {
		var small [16]string
		names := small[:0]
		for k := range header {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			vs := header[k]
			dst = appendString(dst, k)
			dst = binary.AppendUvarint(dst, uint64(len(vs)))
			for _, v := range vs {
				dst = appendString(dst, v)
			}
		}
	}
	return append(dst, body...)
}

func appendCRC(dst []byte, start int) []byte {
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], table))
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Check verifies b's version and checksum and returns its state byte.
func Check(b []byte) (state uint8, err error) {
	if len(b) == 0 {
		return 0, fmt.Errorf("%w: empty", ErrCorrupt)
	}
	n := len(b) - crcSize
	sumOK := n > 0 && crc32.Checksum(b[:n], table) == binary.LittleEndian.Uint32(b[n:])
	if b[0] != Version && b[0] != VersionExt {
		if !sumOK {
			// Every version ends in this checksum: a record that fails it
			// is damaged, whatever its first byte says.
			return 0, fmt.Errorf("%w: checksum mismatch (and version byte %d)", ErrCorrupt, b[0])
		}
		return 0, fmt.Errorf("%w %d (this version reads %d and %d)", ErrVersion, b[0], Version, VersionExt)
	}
	if len(b) < minSize {
		return 0, fmt.Errorf("%w: %d bytes is too short", ErrCorrupt, len(b))
	}
	if !sumOK {
		return 0, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	return b[1], nil
}

// Decode decodes b into r, overwriting every field. r does not refer to b
// afterwards: b may be memory that is only valid inside a transaction.
// The head's strings (name, URL, owner, ...; trace and history too) share
// one allocation, the header's names and values another; the body has its
// own (nil when empty).
func Decode(b []byte, r *Record) error {
	req, err := DecodeHead(b, r)
	if err != nil {
		return err
	}
	return decodeRequest(req, r)
}

// DecodeHead decodes b into r without its request section: r.Header and
// r.Body are set to nil, and req is that section, a sub-slice of b for
// AppendWithRequest. Like Decode, it verifies the checksum of all of b.
func DecodeHead(b []byte, r *Record) (req []byte, err error) {
	return decodeHead(b, r, false)
}

// DecodeHeadAlias is DecodeHead without a copy: r's strings refer to b,
// so r must not be used once b may change (for bbolt, after the
// transaction, or after a write to the bucket). It suits a change that
// rewrites the record at once.
func DecodeHeadAlias(b []byte, r *Record) (req []byte, err error) {
	return decodeHead(b, r, true)
}

func decodeHead(b []byte, r *Record, alias bool) (req []byte, err error) {
	if _, err := Check(b); err != nil {
		return nil, err
	}
	b = b[:len(b)-crcSize]
	d := decoder{b: b, off: 3}
	r.State = b[1]
	r.Flags = b[2] &^ codecFlags
	r.Created = d.varint()
	r.Updated = r.Created + d.varint()
	r.LeaseUntil = 0
	if b[2]&flagLease != 0 {
		r.LeaseUntil = r.Created + d.varint()
	}
	r.Attempts = int64(d.uvarint())
	r.LastStatus = int64(d.uvarint())
	if d.err == nil {
		if len(b)-d.off < 32 {
			d.fail("fingerprint")
		} else {
			copy(r.Fingerprint[:], b[d.off:d.off+32])
			d.off += 32
		}
	}
	// The six or seven strings are sliced from one copy of their bytes.
	start := d.off
	var spans [7][2]int
	nstr := 6
	if b[2]&flagKeyHeader != 0 {
		nstr = 7
	}
	for i := range nstr {
		n := d.uvarint()
		if d.err != nil {
			break
		}
		if n > uint64(len(b)-d.off) {
			d.fail("string length")
			break
		}
		spans[i] = [2]int{d.off - start, d.off - start + int(n)}
		d.off += int(n)
	}
	// The extension's strings are sliced from the same copy: find its
	// end first.
	extStart, nhist := d.off, uint64(0)
	if d.err == nil && b[0] == VersionExt {
		d.skipString()
		nhist = d.uvarint()
		// Each entry takes at least five bytes, which bounds the count by
		// the input before anything is allocated.
		if d.err == nil && nhist > uint64(len(b)-d.off)/5 {
			d.fail("history count")
		}
		for i := uint64(0); i < nhist && d.err == nil; i++ {
			d.varint()
			d.uvarint()
			d.uvarint()
			d.skipString()
			d.skipString()
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	var s string
	if alias {
		if d.off > start {
			s = unsafe.String(&b[start], d.off-start)
		}
	} else {
		s = string(b[start:d.off])
	}
	str := func(i int) string { return s[spans[i][0]:spans[i][1]] }
	r.Name, r.Method, r.URL, r.Host, r.LastError, r.Owner = str(0), str(1), str(2), str(3), str(4), str(5)
	r.KeyHeader = str(6) // empty without flag bit 6
	r.Trace, r.History = "", nil
	if b[0] == VersionExt {
		ed := decoder{b: b[:d.off], off: extStart, s: s, base: start}
		r.Trace = ed.str()
		ed.uvarint()
		if nhist > 0 {
			r.History = make([]Attempt, nhist)
			for i := range r.History {
				a := &r.History[i]
				a.At = r.Created + ed.varint()
				a.Sent, a.Status = int64(ed.uvarint()), int64(ed.uvarint())
				a.Err, a.Reason = ed.str(), ed.str()
			}
		}
	}
	r.Header, r.Body = nil, nil
	if d.off >= len(b) {
		d.fail("request section")
		return nil, d.err
	}
	return b[d.off:], nil
}

// decodeRequest decodes a request section into r.Header and r.Body.
func decodeRequest(req []byte, r *Record) error {
	d := decoder{b: req}
	n := d.uvarint()
	if d.err != nil {
		return d.err
	}
	if n > 0 {
		// Each header entry takes at least two bytes, which bounds n by the
		// input before anything is allocated.
		if n > uint64(len(req)-d.off)/2 {
			d.fail("header count")
			return d.err
		}
		// Find the end of the header entries first, to copy them once.
		start, off := d.off, d.off
		for i := uint64(0); i < n && d.err == nil; i++ {
			d.skipString()
			m := d.uvarint()
			if m > uint64(len(req)-d.off) {
				d.fail("header value count")
			}
			for j := uint64(0); j < m && d.err == nil; j++ {
				d.skipString()
			}
		}
		if d.err != nil {
			return d.err
		}
		hd := decoder{b: req[:d.off], off: off, s: string(req[start:d.off]), base: start}
		h := make(map[string][]string, n)
		for i := uint64(0); i < n; i++ {
			k := hd.str()
			m := hd.uvarint()
			vs := make([]string, 0, m)
			for j := uint64(0); j < m; j++ {
				vs = append(vs, hd.str())
			}
			if _, dup := h[k]; dup {
				d.fail("duplicate header")
				return d.err
			}
			h[k] = vs
		}
		r.Header = h
	}
	if d.off < len(req) {
		r.Body = slices.Clone(req[d.off:])
	}
	return nil
}

type decoder struct {
	b    []byte
	off  int
	err  error
	s    string // b[base:] as a string, for str
	base int
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
	x, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.off += n
	return x
}

func (d *decoder) varint() int64 {
	ux := d.uvarint()
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x
}

// bytes reads a length-prefixed string and returns its bytes, a
// sub-slice of d.b (nil on error).
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)-d.off) {
		d.fail("string length")
		return nil
	}
	b := d.b[d.off : d.off+int(n)]
	d.off += int(n)
	return b
}

// skipString reads a length-prefixed string and drops it.
func (d *decoder) skipString() { d.bytes() }

// str reads a string from d.s; the caller has checked the bounds.
func (d *decoder) str() string {
	n := int(d.uvarint())
	s := d.s[d.off-d.base : d.off-d.base+n]
	d.off += n
	return s
}
