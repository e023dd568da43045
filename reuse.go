package idem

import (
	"hash/maphash"
	"net/http"
	"net/url"
	"slices"
	"sync"
)

// lastRequest remembers the journaled header and URL of the keyed
// requests a journal saw last, so that a client sending the same headers
// or the same URL again shares one copy instead of making one per
// request: a header map and its group, and the URL's text, three
// allocations of a keyed request. What it hands out is never changed
// (records keep it as given; stores copy what they return), so
// operations may share it; and it never holds a caller's value slices.
type lastRequest struct {
	mu sync.Mutex
	// header is a journaled header with value slices of its own, made
	// when the same header content missed twice in a row; missSum is the
	// content sum of the last one that missed.
	header  http.Header
	missSum uint64
	// u and text are the last URL without user info or secret query
	// parameters, and its text.
	u    url.URL
	text string
}

// headerSeed seeds the content sums of headers.
var headerSeed = maphash.MakeSeed()

// journaledURL returns the URL as the journal keeps it: without user info
// and without the secret query parameters. redacted reports whether
// anything was removed. A URL equal to the last one shares its text.
func (c *config) journaledURL(u *url.URL, last *lastRequest) (s string, redacted bool) {
	if u.User != nil || u.RawQuery != "" && c.hasSecretQuery(u.RawQuery) {
		return c.redactedURL(u), true
	}
	if last == nil {
		return u.String(), false
	}
	last.mu.Lock()
	if last.u == *u {
		s = last.text
	}
	last.mu.Unlock()
	if s != "" {
		return s, false
	}
	s = u.String()
	last.mu.Lock()
	last.u, last.text = *u, s
	last.mu.Unlock()
	return s, false
}

// journaledHeader returns the headers worth replaying after a crash: all
// but the secret ones and the key header (which is re-added from the key),
// and whether a secret one was removed. What it returns is the journal's
// own: its value slices never alias the caller's, so a caller that edits
// a header value in place after its call (say, after an error left the
// operation in doubt) cannot change what a store keeps, whatever the store
// (the memory store keeps what Reserve is given). Headers with the same
// content as the last shared ones get those; content seen twice in a row
// becomes the shared one.
func (c *config) journaledHeader(h http.Header, last *lastRequest) (out http.Header, redacted bool) {
	var shared http.Header
	if last != nil {
		last.mu.Lock()
		shared = last.header
		last.mu.Unlock()
	}
	n, nv, same := 0, 0, shared != nil
	for k, v := range h {
		if ck := http.CanonicalHeaderKey(k); c.isSecretHeader(ck) || ck == c.header {
			redacted = redacted || c.isSecretHeader(ck)
			continue
		}
		n, nv = n+1, nv+len(v)
		if same {
			sv, ok := shared[k]
			same = ok && slices.Equal(sv, v)
		}
	}
	if same && n == len(shared) {
		return shared, redacted
	}
	// A miss: a header of its own, its values copied into one array (each
	// entry's slice capped, so that no append reaches its neighbour).
	out = make(http.Header, n)
	values := make([]string, 0, nv)
	var sum uint64 // of the entries, in no order
	for k, v := range h {
		if ck := http.CanonicalHeaderKey(k); c.isSecretHeader(ck) || ck == c.header {
			continue
		}
		values = append(values, v...)
		out[k] = values[len(values)-len(v) : len(values) : len(values)]
		if last != nil {
			sum += entrySum(k, v)
		}
	}
	if last == nil {
		return out, redacted
	}
	last.mu.Lock()
	again := last.missSum == sum
	last.missSum = sum
	if again {
		// The same content twice in a row: out becomes the shared header.
		// No caller can change it, and no record changes what it holds.
		last.header = out
	}
	last.mu.Unlock()
	return out, redacted
}

// entrySum returns the hash of one header entry.
func entrySum(k string, v []string) uint64 {
	var m maphash.Hash
	m.SetSeed(headerSeed)
	m.WriteString(k)
	for _, s := range v {
		m.WriteByte(0)
		m.WriteString(s)
	}
	return m.Sum64()
}
