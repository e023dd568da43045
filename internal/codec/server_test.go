package codec_test

import (
	"errors"
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
