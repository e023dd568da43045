package idem

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"testing"
)

// errReader returns its bytes, then err instead of io.EOF.
type errReader struct {
	b   []byte
	err error
}

func (r *errReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, r.err
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestReadBodyKnownLength checks readBody on bodies whose ContentLength
// is known: the body as it is, a body shorter or longer than its length
// refused with the length error, a read error before the end returned as
// it is, one after the end ignored; and one allocation, the body's.
func TestReadBodyKnownLength(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name    string
		body    io.Reader
		length  int64
		want    string
		wantErr string
		isErr   error
	}{
		{name: "exact", body: bytes.NewReader([]byte("hello")), length: 5, want: "hello"},
		{name: "shorter", body: bytes.NewReader([]byte("hell")), length: 5, wantErr: "body is 4 bytes, shorter than its ContentLength 5"},
		{name: "empty", body: bytes.NewReader(nil), length: 5, wantErr: "body is 0 bytes, shorter than its ContentLength 5"},
		{name: "longer", body: bytes.NewReader([]byte("hello!")), length: 5, wantErr: "body is longer than its ContentLength 5"},
		{name: "read error", body: &errReader{b: []byte("he"), err: boom}, length: 5, isErr: boom},
		{name: "error after the end", body: &errReader{b: []byte("hello"), err: boom}, length: 5, want: "hello"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &http.Request{Body: io.NopCloser(tt.body), ContentLength: tt.length}
			got, rest, err := readBody(req, 1<<20)
			if rest != nil {
				t.Fatal("rest is not nil")
			}
			switch {
			case tt.isErr != nil:
				if !errors.Is(err, tt.isErr) {
					t.Fatalf("err %v, want %v", err, tt.isErr)
				}
			case tt.wantErr != "":
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				if !errors.Is(invalidIf(err), ErrInvalidRequest) {
					t.Errorf("invalidIf(%v) is not ErrInvalidRequest", err)
				}
			default:
				if err != nil || string(got) != tt.want || cap(got) != len(got) {
					t.Fatalf("got %q (cap %d), %v; want %q", got, cap(got), err, tt.want)
				}
			}
		})
	}
	if raceEnabled {
		return
	}
	body := bytes.Repeat([]byte("x"), 100)
	r := bytes.NewReader(body)
	req := &http.Request{ContentLength: int64(len(body))}
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(body)
		req.Body = io.NopCloser(r)
		if _, _, err := readBody(req, 1<<20); err != nil {
			t.Fatal(err)
		}
	})
	// One for the body, one for the NopCloser made above.
	if allocs != 2 {
		t.Errorf("readBody allocates %v times, want 1 (the body)", allocs-1)
	}
}
