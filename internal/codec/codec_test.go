package codec_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"reflect"
	"strings"
	"testing"

	"github.com/idemgo/idem/internal/codec"
)

func sample() codec.Record {
	return codec.Record{
		Name:   "pay:order-42",
		Method: "POST", URL: "https://api.example.com/v1/charges", Host: "pay.internal", Flags: 3,
		Fingerprint: [32]byte{1, 2, 3, 31: 0xff},
		State:       1, Attempts: 3, LastStatus: 503, LastError: "connection reset",
		Created: 1_700_000_000_000_000_001, Updated: -5, LeaseUntil: 1 << 62,
		Owner:  "host-1/1234",
		Header: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "", "c"}, "X-Empty": {}},
		Body:   []byte(`{"amount":4200}`),
	}
}

// finished is a finished record as the journal keeps it: no request.
func finished() codec.Record {
	r := sample()
	r.State, r.Flags, r.LeaseUntil = 2, 1, 0
	r.Header, r.Body, r.LastError = nil, nil, ""
	r.Owner = "idem-host-1-4242"
	r.URL = "https://api.example.com/v1/charges"
	r.Updated = r.Created + 35_000_000
	return r
}

// seal sets b's version byte and appends a valid checksum, so that a test
// reaches the field parser with arbitrary bytes.
func seal(b []byte) []byte {
	if len(b) == 0 {
		b = []byte{0}
	}
	b = bytes.Clone(b)
	if b[0] != codec.VersionExt {
		b[0] = codec.Version
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  codec.Record
	}{
		{"zero", codec.Record{}},
		{"full", sample()},
		{"finished", finished()},
		{"negative times", codec.Record{Created: -5, Updated: -1 << 62, LeaseUntil: 1 << 62}},
		{"with history", withHistory()},
		{"with a trace only", codec.Record{Trace: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
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
	for _, v := range []byte{0, 1, 4, 0xff} {
		// A newer version: another first byte, and its own checksum.
		newer := bytes.Clone(b[:len(b)-4])
		newer[0] = v
		newer = binary.LittleEndian.AppendUint32(newer, crc32.Checksum(newer, crc32.MakeTable(crc32.Castagnoli)))
		err := codec.Decode(newer, new(codec.Record))
		if !errors.Is(err, codec.ErrVersion) || errors.Is(err, codec.ErrCorrupt) {
			t.Errorf("version %d: got %v, want ErrVersion only", v, err)
		}
		if err != nil && !strings.Contains(err.Error(), "unknown record version") {
			t.Errorf("version %d: unclear message %q", v, err)
		}
		// A damaged version byte: the checksum fails.
		damaged := bytes.Clone(b)
		damaged[0] = v
		if err := codec.Decode(damaged, new(codec.Record)); !errors.Is(err, codec.ErrCorrupt) || errors.Is(err, codec.ErrVersion) {
			t.Errorf("damaged version byte %d: got %v, want ErrCorrupt only", v, err)
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

func TestChecksumCatchesEveryFlippedBit(t *testing.T) {
	rec := sample()
	b := codec.Encode(&rec)
	for i := 8; i < len(b)*8; i++ { // byte 0 is the version: ErrVersion
		c := bytes.Clone(b)
		c[i/8] ^= 1 << (i % 8)
		if err := codec.Decode(c, new(codec.Record)); !errors.Is(err, codec.ErrCorrupt) {
			t.Fatalf("bit %d flipped: got %v, want ErrCorrupt", i, err)
		}
	}
}

func TestFinishedRecordIsSmall(t *testing.T) {
	rec := finished()
	// On disk a record also takes its 36-byte UUID key and bbolt's 16-byte
	// leaf element header.
	n := 16 + 36 + len(codec.Encode(&rec))
	if n > 200 {
		t.Fatalf("a finished record takes %d bytes, want at most 200", n)
	}
	t.Logf("a finished record: %d bytes of value, %d with its key and element header", len(codec.Encode(&rec)), n)
}

func TestHeadAndRequest(t *testing.T) {
	rec := sample()
	b := codec.Encode(&rec)
	var head codec.Record
	req, err := codec.DecodeHead(b, &head)
	if err != nil {
		t.Fatal(err)
	}
	if head.Header != nil || head.Body != nil || head.URL != rec.URL || head.LeaseUntil != rec.LeaseUntil {
		t.Fatalf("DecodeHead = %+v", head)
	}
	head.Attempts++
	again := codec.AppendWithRequest(nil, &head, req)
	var got codec.Record
	if err := codec.Decode(again, &got); err != nil {
		t.Fatal(err)
	}
	want := sample()
	want.Attempts++
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after AppendWithRequest: got %+v, want %+v", got, want)
	}
	// No request section: a finished record.
	var fin codec.Record
	if err := codec.Decode(codec.AppendWithRequest(nil, &head, nil), &fin); err != nil || fin.Header != nil || fin.Body != nil {
		t.Fatalf("without request: %+v, %v", fin, err)
	}
}

func TestDecodeHugeCounts(t *testing.T) {
	// A header count far beyond the input must be refused before allocating.
	r := codec.Record{}
	b := codec.Encode(&r)
	b = seal(append(b[:len(b)-5], 0xff, 0xff, 0xff, 0xff, 0x0f))
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
	f.Add("k", s.Name, s.URL, s.LastError, uint8(1), int64(3), int64(503), int64(1), int64(-1), "X-A", "v", []byte(nil))
	f.Add("", "", "", "", uint8(0), int64(0), int64(0), int64(0), int64(0), "", "", codec.Encode(&s))
	h := withHistory()
	f.Add("", "", "", "", uint8(0), int64(0), int64(0), int64(0), int64(0), "", "", codec.Encode(&h)[:len(codec.Encode(&h))-4])
	f.Add("k", "n", "u", "e", uint8(9), int64(-1), int64(1<<40), int64(-1<<62), int64(1<<62), "h", "", []byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, key, name, url, lastErr string, state uint8, attempts, status, created, updated int64, hk, hv string, raw []byte) {
		rec := codec.Record{
			Name: name + key, Method: "POST", URL: url, LastError: lastErr,
			State: state, Attempts: attempts, LastStatus: status, Created: created, Updated: updated,
			Fingerprint: [32]byte{state}, KeyHeader: hk,
		}
		if hk != "" {
			rec.Header = map[string][]string{hk: {hv, hv + hv}}
		}
		var got codec.Record
		if err := codec.Decode(codec.Encode(&rec), &got); err != nil {
			t.Fatalf("decode of encoded record: %v", err)
		}
		if got.Name != rec.Name || got.URL != rec.URL || got.LastError != rec.LastError ||
			got.State != rec.State || got.Attempts != rec.Attempts || got.LastStatus != rec.LastStatus ||
			got.Created != rec.Created || got.Updated != rec.Updated || len(got.Header) != len(rec.Header) ||
			got.KeyHeader != rec.KeyHeader {
			t.Fatalf("round trip: got %+v, want %+v", got, rec)
		}
		if hk != "" && (got.Header[hk][0] != hv || got.Header[hk][1] != hv+hv) {
			t.Fatalf("header round trip: got %q", got.Header)
		}

		// Arbitrary bytes: never a panic; an error is ErrVersion or
		// ErrCorrupt; a success re-encodes to a record that decodes equal.
		var any codec.Record
		if err := codec.Decode(seal(raw), &any); err != nil {
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

func TestKeyHeaderRoundTripAndOldRecords(t *testing.T) {
	rec := sample()
	rec.KeyHeader = "PayPal-Request-Id"
	var got codec.Record
	if err := codec.Decode(codec.Encode(&rec), &got); err != nil {
		t.Fatal(err)
	}
	if got.KeyHeader != rec.KeyHeader || got.Owner != rec.Owner || !reflect.DeepEqual(got.Header, rec.Header) {
		t.Fatalf("got key header %q owner %q header %v, want %q %q %v", got.KeyHeader, got.Owner, got.Header, rec.KeyHeader, rec.Owner, rec.Header)
	}
	// A record without a key header is encoded as before the field
	// existed: flag bit 6 clear, nothing after the owner.
	rec.KeyHeader = ""
	b := codec.Encode(&rec)
	if b[2]&(1<<6) != 0 {
		t.Fatalf("flags %08b: bit 6 set without a key header", b[2])
	}
	if err := codec.Decode(b, &got); err != nil || got.KeyHeader != "" {
		t.Fatalf("old-style record: key header %q, err %v", got.KeyHeader, err)
	}
}

func TestPolicyRoundTrip(t *testing.T) {
	p := codec.Policy{KeyHeader: "Cko-Idempotency-Key", ResendWindow: 47 * 3600e9, Retention: 48 * 3600e9, MatchWindow: 120e9}
	b := codec.EncodePolicy(&p)
	var got codec.Policy
	if err := codec.DecodePolicy(b, &got); err != nil || got != p {
		t.Fatalf("got %+v, %v; want %+v", got, err, p)
	}
	for i := range len(b) * 8 {
		c := bytes.Clone(b)
		c[i/8] ^= 1 << (i % 8)
		if err := codec.DecodePolicy(c, &got); !errors.Is(err, codec.ErrCorrupt) && !errors.Is(err, codec.ErrVersion) {
			t.Fatalf("bit %d flipped: %v", i, err)
		}
	}
	if err := codec.DecodePolicy(b[:3], &got); !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("truncated: %v", err)
	}
}

// withHistory is a pending record with a key header, a trace and three
// recorded attempts.
func withHistory() codec.Record {
	r := sample()
	r.KeyHeader = "Idem-Key"
	r.Trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	r.History = []codec.Attempt{
		{At: r.Created + 1e9, Sent: 1, Status: 503, Reason: "503"},
		{At: r.Created + 2e9, Sent: 2, Err: "read tcp: connection reset by peer", Reason: "network error"},
		{At: r.Created - 7, Sent: 1, Status: 409, Reason: "409 in progress"},
	}
	return r
}

// Records without a trace or a history encode as version 2 did, byte for
// byte (these were encoded by the codec before the extension existed),
// and read with neither.
func TestVersion2RecordsUnchanged(t *testing.T) {
	pending := sample()
	pending.KeyHeader = "Idem-Key"
	for _, tc := range []struct {
		name string
		rec  codec.Record
		gold string
	}{
		{"pending", pending, "0201c38280d0e2c6bfce972f8b80d0e2c6bfce972ffeffaf9db9c0b1e85003f70301020300000000000000000000000000000000000000000000000000000000ff0c7061793a6f726465722d343204504f53542268747470733a2f2f6170692e6578616d706c652e636f6d2f76312f636861726765730c7061792e696e7465726e616c10636f6e6e656374696f6e2072657365740b686f73742d312f31323334084964656d2d4b6579030c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e07582d456d7074790007582d4d756c74690301610001637b22616d6f756e74223a343230307d3156c14c"},
		{"finished", finished(), "0202018280d0e2c6bfce972f80bbb02103f70301020300000000000000000000000000000000000000000000000000000000ff0c7061793a6f726465722d343204504f53542268747470733a2f2f6170692e6578616d706c652e636f6d2f76312f636861726765730c7061792e696e7465726e616c00106964656d2d686f73742d312d3432343200315a5718"},
	} {
		gold, err := hex.DecodeString(tc.gold)
		if err != nil {
			t.Fatal(err)
		}
		if got := codec.Encode(&tc.rec); !bytes.Equal(got, gold) {
			t.Errorf("%s: encoding changed:\n got %x\nwant %x", tc.name, got, gold)
		}
		var got codec.Record
		if err := codec.Decode(gold, &got); err != nil || got.Trace != "" || got.History != nil || !reflect.DeepEqual(got, tc.rec) {
			t.Errorf("%s: old record read as %+v, %v", tc.name, got, err)
		}
	}
	h := withHistory()
	if b := codec.Encode(&h); b[0] != codec.VersionExt {
		t.Errorf("a record with a history is version %d, want %d", b[0], codec.VersionExt)
	}
}

// A mark rewrites a record from its aliased head and raw request section
// (DecodeHeadAlias, AppendWithRequest): its history and trace survive,
// and the request section stays where it was.
func TestHistoryThroughHeadRewrite(t *testing.T) {
	rec := withHistory()
	b := codec.Encode(&rec)
	var r codec.Record
	req, err := codec.DecodeHeadAlias(b, &r)
	if err != nil {
		t.Fatal(err)
	}
	r.History = append(r.History, codec.Attempt{At: r.Created + 3e9, Sent: 1, Status: 502, Reason: "502"})
	out := codec.AppendWithRequest(make([]byte, 0, codec.HeadSize(&r)+len(req)), &r, req)
	var got codec.Record
	if err := codec.Decode(out, &got); err != nil {
		t.Fatal(err)
	}
	want := withHistory()
	want.History = append(want.History, codec.Attempt{At: want.Created + 3e9, Sent: 1, Status: 502, Reason: "502"})
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if len(out) > cap(make([]byte, 0, codec.HeadSize(&r)+len(req))) {
		t.Errorf("HeadSize too small: %d bytes written", len(out))
	}
}

// A history count beyond what the input can hold is refused before
// anything is allocated, and every truncation of a version 3 record is
// an error, never a panic.
func TestHistoryDamage(t *testing.T) {
	rec := withHistory()
	rec.Header, rec.Body = nil, nil
	b := codec.Encode(&rec)
	for n := range len(b) - 4 {
		c := bytes.Clone(b[:n])
		if len(c) > 0 {
			c = binary.LittleEndian.AppendUint32(c, crc32.Checksum(c, crc32.MakeTable(crc32.Castagnoli)))
		}
		if err := codec.Decode(c, new(codec.Record)); err == nil {
			t.Fatalf("truncated to %d bytes: no error", n)
		}
	}
}
