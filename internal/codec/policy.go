package codec

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// PolicyVersion is the version of the policy record AppendPolicy writes.
//
// A policy record is the journal's copy of the application's policy:
//
//	version      1 byte (1)
//	key header   uvarint length + bytes
//	resend window, retention, match window: uvarint nanoseconds each
//	crc          4 bytes, CRC-32C of everything before, little endian
const PolicyVersion byte = 1

// Policy is a policy record as the codec sees it. Durations are
// nanoseconds.
type Policy struct {
	KeyHeader                            string
	ResendWindow, Retention, MatchWindow int64
}

// EncodePolicy returns the encoding of p.
func EncodePolicy(p *Policy) []byte {
	b := make([]byte, 0, 1+binary.MaxVarintLen64*4+len(p.KeyHeader)+crcSize)
	b = append(b, PolicyVersion)
	b = appendString(b, p.KeyHeader)
	for _, d := range [...]int64{p.ResendWindow, p.Retention, p.MatchWindow} {
		b = binary.AppendUvarint(b, uint64(max(d, 0)))
	}
	return appendCRC(b, 0)
}

// DecodePolicy decodes a policy record. Damaged input is an error matching
// ErrCorrupt, an unknown version one matching ErrVersion.
func DecodePolicy(b []byte, p *Policy) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: empty policy", ErrCorrupt)
	}
	if b[0] != PolicyVersion {
		return fmt.Errorf("%w %d of the policy (this version reads %d)", ErrVersion, b[0], PolicyVersion)
	}
	if len(b) < 1+crcSize {
		return fmt.Errorf("%w: policy of %d bytes is too short", ErrCorrupt, len(b))
	}
	n := len(b) - crcSize
	if crc32.Checksum(b[:n], table) != binary.LittleEndian.Uint32(b[n:]) {
		return fmt.Errorf("%w: policy checksum mismatch", ErrCorrupt)
	}
	d := decoder{b: b[:n], off: 1}
	l := d.uvarint()
	if d.err == nil && l > uint64(n-d.off) {
		d.fail("policy key header length")
	}
	if d.err != nil {
		return d.err
	}
	p.KeyHeader = string(b[d.off : d.off+int(l)])
	d.off += int(l)
	p.ResendWindow = int64(d.uvarint())
	p.Retention = int64(d.uvarint())
	p.MatchWindow = int64(d.uvarint())
	if d.err == nil && d.off != n {
		d.fail("policy trailing bytes")
	}
	return d.err
}
