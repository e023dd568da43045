// Package fingerprint computes the payload fingerprint that ties an
// idempotency key to one request: a key is never sent with a payload whose
// fingerprint differs from the one journaled with it.
package fingerprint

import (
	"crypto/sha256"
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
