package codec_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"reflect"

	"github.com/idemgo/idem/internal/codec"
)

func sample() codec.Record {
	return codec.Record{
		Key: "0190d4f2-7c1e-7a3b-9f00-000000000001", Name: "pay:order-42",
		Method: "POST", URL: "https://api.example.com/v1/charges", Host: "pay.internal", Flags: 3,
		Fingerprint: [32]byte{1, 2, 3, 31: 0xff},
		State:       1, Attempts: 3, LastStatus: 503, LastError: "connection reset",
		Created: 1_700_000_000_000_000_001, Updated: -5, LeaseUntil: 1 << 62,
		Owner:  "host-1/1234",
		Header: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "", "c"}, "X-Empty": {}},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  codec.Record
	}{
		{"zero", codec.Record{}},
		{"full", sample()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := codec.Encode(&tc.rec)
			var got codec.Record
			if err := codec.Decode(b, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.rec) {
				t.Errorf("got %+v, want %+v", got, tc.rec)
			}
			if n := codec.Size(&tc.rec); len(b) > n {
				t.Errorf("encoded %d bytes, Size said at most %d", len(b), n)
			}
		})
	}
}

func TestDecodeUnknownVersion(t *testing.T) {
	rec := sample()
	b := codec.Encode(&rec)
	for _, v := range []byte{0, 2, 0xff} {
		b[0] = v
		err := codec.Decode(b, new(codec.Record))
		if !errors.Is(err, codec.ErrVersion) || errors.Is(err, codec.ErrCorrupt) {
			t.Errorf("version %d: got %v, want ErrVersion only", v, err)
		}
		if err != nil && !strings.Contains(err.Error(), "unknown record version") {
			t.Errorf("version %d: unclear message %q", v, err)
		}
	}
}

func TestDecodeTruncatedAndTrailing(t *testing.T) {
	rec := sample()
	b := codec.Encode(&rec)
	for n := 0; n < len(b); n++ {
		if err := codec.Decode(b[:n], new(codec.Record)); !errors.Is(err, codec.ErrCorrupt) {
			t.Fatalf("truncated to %d of %d bytes: got %v, want ErrCorrupt", n, len(b), err)
		}
	}
	if err := codec.Decode(append(bytes.Clone(b), 0), new(codec.Record)); !errors.Is(err, codec.ErrCorrupt) {
		t.Errorf("trailing byte: got %v, want ErrCorrupt", err)
	}
}

func TestDecodeHugeCounts(t *testing.T) {
	// A header count far beyond the input must be refused before allocating.
	r := codec.Record{}
	b := codec.Encode(&r)
	b = append(b[:len(b)-1], 0xff, 0xff, 0xff, 0xff, 0x0f)
	if err := codec.Decode(b, new(codec.Record)); !errors.Is(err, codec.ErrCorrupt) {
		t.Errorf("got %v, want ErrCorrupt", err)
	}
}

func TestDecodeDoesNotAlias(t *testing.T) {
	rec := sample()
	b := codec.Encode(&rec)
	var got codec.Record
	if err := codec.Decode(b, &got); err != nil {
		t.Fatal(err)
	}
	clear(b)
	if want := sample(); !reflect.DeepEqual(got, want) {
		t.Errorf("after clearing the input: got %+v, want %+v", got, want)
	}
}

func FuzzRoundTrip(f *testing.F) {
	s := sample()
	f.Add(s.Key, s.Name, s.URL, s.LastError, uint8(1), int64(3), int64(503), int64(1), int64(-1), "X-A", "v", []byte(nil))
	f.Add("", "", "", "", uint8(0), int64(0), int64(0), int64(0), int64(0), "", "", codec.Encode(&s))
	f.Add("k", "n", "u", "e", uint8(9), int64(-1), int64(1<<40), int64(-1<<62), int64(1<<62), "h", "", []byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, key, name, url, lastErr string, state uint8, attempts, status, created, updated int64, hk, hv string, raw []byte) {
		rec := codec.Record{
			Key: key, Name: name, Method: "POST", URL: url, LastError: lastErr,
			State: state, Attempts: attempts, LastStatus: status, Created: created, Updated: updated,
			Fingerprint: [32]byte{state},
		}
		if hk != "" {
			rec.Header = map[string][]string{hk: {hv, hv + hv}}
		}
		var got codec.Record
		if err := codec.Decode(codec.Encode(&rec), &got); err != nil {
			t.Fatalf("decode of encoded record: %v", err)
		}
		if got.Key != rec.Key || got.Name != rec.Name || got.URL != rec.URL || got.LastError != rec.LastError ||
			got.State != rec.State || got.Attempts != rec.Attempts || got.LastStatus != rec.LastStatus ||
			got.Created != rec.Created || got.Updated != rec.Updated || len(got.Header) != len(rec.Header) {
			t.Fatalf("round trip: got %+v, want %+v", got, rec)
		}
		if hk != "" && (got.Header[hk][0] != hv || got.Header[hk][1] != hv+hv) {
			t.Fatalf("header round trip: got %q", got.Header)
		}

		// Arbitrary bytes: never a panic; an error is ErrVersion or
		// ErrCorrupt; a success re-encodes to a record that decodes equal.
		var any codec.Record
		if err := codec.Decode(raw, &any); err != nil {
			if !errors.Is(err, codec.ErrCorrupt) && !errors.Is(err, codec.ErrVersion) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		var again codec.Record
		if err := codec.Decode(codec.Encode(&any), &again); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !bytes.Equal(codec.Encode(&any), codec.Encode(&again)) {
			t.Fatalf("re-encode differs")
		}
	})
}

func BenchmarkEncode(b *testing.B) {
	rec := sample()
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = codec.Append(buf[:0], &rec)
	}
}

func BenchmarkDecode(b *testing.B) {
	rec := sample()
	enc := codec.Encode(&rec)
	var got codec.Record
	b.ReportAllocs()
	for b.Loop() {
		if err := codec.Decode(enc, &got); err != nil {
			b.Fatal(err)
		}
	}
}
