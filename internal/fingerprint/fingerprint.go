// Package fingerprint computes the payload fingerprint that ties an
// idempotency key to one request: a key is never sent with a payload whose
// fingerprint differs from the one journaled with it.
package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"io"
	"net/http"
)

// PayloadHeaders are the headers that change what a body means; they are
// part of the fingerprint. Other headers (tracing, user agent, credentials)
// may differ between attempts without making it another request.
var PayloadHeaders = [...]string{"Content-Type", "Content-Encoding", "Content-Language"}

// Sum returns the SHA-256 over the method, the URL, the payload headers and
// the body, each length-prefixed so that no two different inputs share an
// encoding.
func Sum(method, url string, h http.Header, body []byte) [32]byte {
	d := sha256.New()
	var n [8]byte
	put := func(b []byte) {
		l := uint64(len(b))
		for i := range n {
			n[i] = byte(l >> (56 - 8*i))
		}
		d.Write(n[:])
		d.Write(b)
	}
	put([]byte(method))
	put([]byte(url))
	for _, k := range PayloadHeaders {
		for _, v := range h.Values(k) {
			put([]byte(k))
			put([]byte(v))
		}
	}
	put(body)
	var out [32]byte
	d.Sum(out[:0])
	return out
}

// SumReader is Sum for a body too large to hold in memory: it reads body
// to its end. Its result differs from Sum's for the same bytes (the body's
// length follows the body instead of preceding it, and a marker tells the
// two apart), so a payload fingerprinted one way is always fingerprinted
// that way.
func SumReader(method, url string, h http.Header, body io.Reader) ([32]byte, error) {
	s := NewStream(method, url, h)
	if _, err := io.Copy(s, body); err != nil {
		return [32]byte{}, err
	}
	return s.Sum(), nil
}

// Stream is SumReader fed by writes: the body's bytes as they stream to
// the server, so that every attempt of a body too large to journal is
// checked against the fingerprint taken of it.
type Stream struct {
	d    hash.Hash
	size uint64
}

// NewStream returns the Stream of a body sent with method, url and h.
func NewStream(method, url string, h http.Header) *Stream {
	s := &Stream{d: sha256.New()}
	var n [8]byte
	put := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		s.d.Write(n[:])
		s.d.Write(b)
	}
	put([]byte("streamed"))
	put([]byte(method))
	put([]byte(url))
	for _, k := range PayloadHeaders {
		for _, v := range h.Values(k) {
			put([]byte(k))
			put([]byte(v))
		}
	}
	return s
}

// Write adds body bytes; it never fails.
func (s *Stream) Write(p []byte) (int, error) {
	s.size += uint64(len(p))
	return s.d.Write(p)
}

// Sum returns the fingerprint of the body written so far, taken as its
// whole. It ends the stream: write nothing after it.
func (s *Stream) Sum() [32]byte {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], s.size)
	d := s.d
	d.Write(n[:])
	var out [32]byte
	d.Sum(out[:0])
	return out
}
