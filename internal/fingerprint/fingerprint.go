// Package fingerprint computes the payload fingerprint that ties an
// idempotency key to one request: a key is never sent with a payload whose
// fingerprint differs from the one journaled with it.
package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
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
	d := sha256.New()
	var n [8]byte
	put := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		d.Write(n[:])
		d.Write(b)
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
	size, err := io.Copy(d, body)
	if err != nil {
		return [32]byte{}, err
	}
	binary.BigEndian.PutUint64(n[:], uint64(size))
	d.Write(n[:])
	var out [32]byte
	d.Sum(out[:0])
	return out, nil
}
