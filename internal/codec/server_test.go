package codec_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/internal/codec"
)

func serverRecords() []codec.ServerRecord {
	return []codec.ServerRecord{
		{Kind: codec.ServerInFlight, Expires: 1_780_000_000_000_000_000, Fingerprint: "ab12", Token: "tok"},
		{Kind: codec.ServerDone, Expires: -5, Status: 201, Fingerprint: "f", Header: map[string][]string{
			"Location": {"/o/1"}, "Content-Type": {"application/json"}, "Link": {"<a>", "<b>"}}, Body: []byte(`{"id":1}`)},
		{Kind: codec.ServerDone, Status: 204},
		{Kind: codec.ServerNotKept, Expires: 7, Status: 200, Fingerprint: "f"},
	}
}

func TestServerRoundTrip(t *testing.T) {
	for _, r := range serverRecords() {
		b := codec.ServerAppend(nil, &r)
		var got codec.ServerRecord
		require.NoError(t, codec.ServerDecode(b, &got))
		assert.Equal(t, r, got)
		// Header order does not change the bytes.
		again := codec.ServerAppend(nil, &got)
		assert.Equal(t, b, again)
	}
}

func TestServerDamage(t *testing.T) {
	r := serverRecords()[1]
	b := codec.ServerAppend(nil, &r)
	for i := range b {
		for _, bit := range []byte{0x01, 0x80} {
			d := append([]byte(nil), b...)
			d[i] ^= bit
			var got codec.ServerRecord
			err := codec.ServerDecode(d, &got)
			require.Error(t, err, "byte %d bit %#x flipped", i, bit)
			assert.True(t, errors.Is(err, codec.ErrCorrupt) || errors.Is(err, codec.ErrVersion), "byte %d: %v", i, err)
		}
	}
	for n := range len(b) {
		var got codec.ServerRecord
		assert.ErrorIs(t, codec.ServerDecode(b[:n], &got), codec.ErrCorrupt, "truncated to %d bytes", n)
	}
}

func FuzzServerDecode(f *testing.F) {
	for _, r := range serverRecords() {
		f.Add(codec.ServerAppend(nil, &r))
	}
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3, 4, 5, 6})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r codec.ServerRecord
		if err := codec.ServerDecode(b, &r); err != nil {
			if !errors.Is(err, codec.ErrCorrupt) && !errors.Is(err, codec.ErrVersion) {
				t.Fatalf("error %v matches neither ErrCorrupt nor ErrVersion", err)
			}
			return
		}
		// What decodes encodes back and decodes to the same record.
		var again codec.ServerRecord
		require.NoError(t, codec.ServerDecode(codec.ServerAppend(nil, &r), &again))
		require.Equal(t, r, again)
	})
}

// TestServerDecodeBadFields reaches the field parser: each record is cut
// inside one field and sealed again with a valid checksum, so the error
// must name that field.
func TestServerDecodeBadFields(t *testing.T) {
	sealed := func(b []byte) []byte {
		return binary.LittleEndian.AppendUint32(bytes.Clone(b), crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
	}
	head := []byte{codec.ServerVersion, codec.ServerDone}
	for _, tc := range []struct {
		name   string
		fields []byte
		says   string
	}{
		{"expiry cut", []byte{0x80}, "expiry"},
		{"status cut", []byte{0x02, 0x80}, "status"},
		{"status above 999", []byte{0x02, 0xe8, 0x07}, "status"},
		{"fingerprint longer than the record", []byte{0x02, 0xc9, 0x01, 0x05, 'a'}, "fingerprint"},
		{"token cut", []byte{0x02, 0xc9, 0x01, 0x01, 'f', 0x80}, "token"},
		{"token longer than the record", []byte{0x02, 0xc9, 0x01, 0x00, 0x03}, "token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r codec.ServerRecord
			err := codec.ServerDecode(sealed(append(bytes.Clone(head), tc.fields...)), &r)
			require.ErrorIs(t, err, codec.ErrCorrupt)
			assert.Contains(t, err.Error(), "bad "+tc.says)
		})
	}
	// The same fields in full, with an empty request section, decode.
	var r codec.ServerRecord
	require.NoError(t, codec.ServerDecode(sealed(append(bytes.Clone(head), 0x02, 0xc9, 0x01, 0x01, 'f', 0x01, 't', 0x00)), &r))
	assert.Equal(t, codec.ServerRecord{Kind: codec.ServerDone, Expires: 1, Status: 201, Fingerprint: "f", Token: "t"}, r)
}
