package codec

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
)

// ServerVersion is the version ServerAppend writes in a record of
// idemserver's bbolt store. It numbers the server format on its own: the
// two kinds of record live in files of their own, each with its format
// marker.
//
// A server record is:
//
//	version     1 byte (1)
//	kind        1 byte: ServerInFlight, ServerDone or ServerNotKept
//	expires     varint, Unix nanoseconds (lease end, or retention end)
//	status      uvarint (0 while in flight)
//	fingerprint, token: uvarint length + bytes each
//	header count uvarint, then per header (names sorted): name, value
//	            count, values
//	body        the remaining bytes
//	crc         4 bytes, CRC-32C (Castagnoli) of everything before, little endian
const ServerVersion byte = 1

// The kinds of a server record.
const (
	// ServerInFlight is a key held under a lease by a running handler.
	ServerInFlight uint8 = 1
	// ServerDone is a key with its stored response.
	ServerDone uint8 = 2
	// ServerNotKept is a key whose handler ran and answered with Status,
	// but whose answer was not kept; it has no header or body.
	ServerNotKept uint8 = 3
)

// ServerRecord is one record of idemserver's bbolt store as the codec
// sees it.
type ServerRecord struct {
	Kind               uint8
	Expires            int64
	Status             int
	Fingerprint, Token string
	Header             map[string][]string
	Body               []byte
}

// ServerAppend appends the encoding of r to dst and returns the extended
// slice. Header names are written in sorted order, so equal records
// encode to equal bytes.
func ServerAppend(dst []byte, r *ServerRecord) []byte {
	n := 2 + 3*binary.MaxVarintLen64 + len(r.Fingerprint) + len(r.Token) + RequestSize(r.Header, r.Body) + crcSize
	dst = slices.Grow(dst, n)
	start := len(dst)
	dst = append(dst, ServerVersion, r.Kind)
	dst = binary.AppendVarint(dst, r.Expires)
	dst = binary.AppendUvarint(dst, uint64(max(r.Status, 0)))
	dst = appendString(dst, r.Fingerprint)
	dst = appendString(dst, r.Token)
	dst = AppendRequest(dst, r.Header, r.Body)
	return appendCRC(dst, start)
}

// ServerDecode decodes b into r. Strings, header and body are copies, so
// b may be reused (bbolt's memory is valid only inside its transaction).
// A truncated or damaged record, one with a bad checksum or an unknown
// kind is an error matching ErrCorrupt; an unknown version byte, one
// matching ErrVersion. It never panics.
func ServerDecode(b []byte, r *ServerRecord) error {
	*r = ServerRecord{}
	if len(b) < 2+crcSize {
		return fmt.Errorf("%w: server record of %d bytes", ErrCorrupt, len(b))
	}
	if b[0] != ServerVersion {
		return fmt.Errorf("%w %d in a server record (this version reads %d)", ErrVersion, b[0], ServerVersion)
	}
	body, sum := b[:len(b)-crcSize], binary.LittleEndian.Uint32(b[len(b)-crcSize:])
	if crc32.Checksum(body, table) != sum {
		return fmt.Errorf("%w: server record checksum mismatch", ErrCorrupt)
	}
	r.Kind = body[1]
	if r.Kind < ServerInFlight || r.Kind > ServerNotKept {
		return fmt.Errorf("%w: server record kind %d", ErrCorrupt, r.Kind)
	}
	d := decoder{b: body, off: 2}
	fail := func(what string) error {
		return fmt.Errorf("%w: bad %s in a server record", ErrCorrupt, what)
	}
	if r.Expires = d.varint(); d.err != nil {
		return fail("expiry")
	}
	status := d.uvarint()
	if d.err != nil || status > 999 {
		return fail("status")
	}
	r.Status = int(status)
	if r.Fingerprint = string(d.bytes()); d.err != nil {
		return fail("fingerprint")
	}
	if r.Token = string(d.bytes()); d.err != nil {
		return fail("token")
	}
	var req Record
	if err := decodeRequest(body[d.off:], &req); err != nil {
		return err
	}
	r.Header, r.Body = req.Header, req.Body
	return nil
}
