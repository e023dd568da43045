package idem

import (
	"net/http"
	"net/url"
	"reflect"
	"testing"
)

func sameMap(a, b http.Header) bool {
	return reflect.ValueOf(a).Pointer() == reflect.ValueOf(b).Pointer()
}

// TestJournaledHeaderShared checks the journaled header a journal shares
// between requests with the same headers: it is made on the second
// request in a row with the same content, handed to the later ones, holds
// values no caller can change, and is never handed to a request whose
// headers differ in any entry; secrets and the key header stay out, and
// redacted still says whether a secret was there.
func TestJournaledHeaderShared(t *testing.T) {
	c := newConfig(nil)
	var last lastRequest
	h := func(extra ...string) http.Header {
		out := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer s"}, "Idempotency-Key": {"k"}, "X-A": {"1", "2"}}
		for i := 0; i+1 < len(extra); i += 2 {
			out[extra[i]] = []string{extra[i+1]}
		}
		return out
	}
	want := http.Header{"Content-Type": {"application/json"}, "X-A": {"1", "2"}}
	first, red := c.journaledHeader(h(), &last)
	if !red || !reflect.DeepEqual(first, want) || last.header != nil {
		t.Fatalf("first: %v, redacted %v, shared %v", first, red, last.header)
	}
	caller := h()
	second, _ := c.journaledHeader(caller, &last)
	if !reflect.DeepEqual(second, want) || last.header == nil || !sameMap(second, last.header) {
		t.Fatalf("second: %v, shared %v", second, last.header)
	}
	caller["X-A"][0] = "changed" // in place, after its call
	third, red := c.journaledHeader(h(), &last)
	if !red || !sameMap(third, second) || !reflect.DeepEqual(third, want) {
		t.Fatalf("third: %v (shared: %v), redacted %v", third, sameMap(third, second), red)
	}
	for _, tt := range []http.Header{
		h("X-B", "1"),            // one more
		{"X-A": {"1", "2"}},      // one less
		h("X-A", "1"),            // another value
		h("Content-Type", "x/y"), // another value
	} {
		got, _ := c.journaledHeader(tt, &last)
		if sameMap(got, second) {
			t.Errorf("%v got the shared header %v", tt, second)
		}
		fresh, _ := c.journaledHeader(tt, nil)
		if !reflect.DeepEqual(got, fresh) {
			t.Errorf("%v: journaled %v, want %v", tt, got, fresh)
		}
	}
	// Without secrets, redacted is false, shared or not.
	plain := http.Header{"Content-Type": {"application/json"}, "X-A": {"1", "2"}}
	if got, red := c.journaledHeader(plain, &last); red || !reflect.DeepEqual(got, want) {
		t.Errorf("plain: %v, redacted %v", got, red)
	}
}

// TestJournaledURLShared checks that a URL equal to the last one gets its
// text, another URL its own, and one with user info or a secret query
// parameter is redacted and not remembered.
func TestJournaledURLShared(t *testing.T) {
	c := newConfig(nil)
	c.secretQuery = map[string]bool{"api_key": true}
	var last lastRequest
	parse := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	for _, tt := range []struct{ in, want string }{
		{"https://api.example/v1/charges?a=1", "https://api.example/v1/charges?a=1"},
		{"https://api.example/v1/charges?a=1", "https://api.example/v1/charges?a=1"},
		{"https://api.example/v1/charges?a=2", "https://api.example/v1/charges?a=2"},
		{"https://u:p@api.example/v1/charges?a=2", "https://api.example/v1/charges?a=2"},
		{"https://api.example/v1/charges?a=2&api_key=s", "https://api.example/v1/charges?a=2"},
		{"https://api.example/v1/refunds", "https://api.example/v1/refunds"},
	} {
		got, red := c.journaledURL(parse(tt.in), &last)
		if got != tt.want || red != (tt.in != tt.want) {
			t.Errorf("%s: %s, redacted %v; want %s", tt.in, got, red, tt.want)
		}
		if last.text != "" && last.u.User != nil {
			t.Errorf("%s: a URL with user info was remembered", tt.in)
		}
	}
	if last.text != "https://api.example/v1/refunds" {
		t.Errorf("last URL %q", last.text)
	}
}
