package idem

import (
	"bytes"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// refAppendCredentials is the first implementation of appendCredentials:
// each credential encoded into a string of its own, the strings sorted.
func (c *config) refAppendCredentials(b []byte, req *http.Request) []byte {
	var creds []string
	for k, vs := range req.Header {
		if ck := http.CanonicalHeaderKey(k); c.secret[ck] {
			for _, v := range vs {
				creds = append(creds, string(appendString(appendString(nil, 'h', ck), 'v', v)))
			}
		}
	}
	if u := req.URL.User; u != nil {
		creds = append(creds, string(appendString(nil, 'u', u.String())))
	}
	if req.URL.RawQuery != "" && c.hasSecretQuery(req.URL.RawQuery) {
		for k, vs := range req.URL.Query() {
			if c.secretQuery[k] || c.secretQuery[strings.ToLower(k)] {
				for _, v := range vs {
					creds = append(creds, string(appendString(appendString(nil, 'q', k), 'v', v)))
				}
			}
		}
	}
	slices.Sort(creds)
	for _, s := range creds {
		b = append(b, s...)
	}
	return b
}

// credentialsOf is appendCredentials with the secret headers collected
// from req's header as matchKey's walk collects them.
func (c *config) credentialsOf(b []byte, req *http.Request) []byte {
	var space [8]credential
	creds := space[:0]
	for k, vs := range req.Header {
		if ck := http.CanonicalHeaderKey(k); c.secret[ck] {
			creds = headerCredentials(creds, ck, vs)
		}
	}
	return c.appendCredentials(b, req, creds)
}

// TestAppendCredentials checks that credentials are encoded in one order
// whatever the order of the header map, the same bytes as the first
// implementation's, and that a call with a few credential headers costs
// no allocation.
func TestAppendCredentials(t *testing.T) {
	c := newConfig([]Option{WithSecretHeaders("X-Api-Key", "X-A"), WithSecretQueryParams("token")})
	tests := []struct {
		name   string
		url    string
		header http.Header
	}{
		{"none", "https://api.example/v1", http.Header{"Content-Type": {"application/json"}}},
		{"one", "https://api.example/v1", http.Header{"Authorization": {"Bearer sk_1"}}},
		{"several", "https://api.example/v1", http.Header{
			"Authorization": {"Bearer sk_1", "Basic b"}, "Cookie": {"a=1", "a=1", "b=2"},
			"X-Api-Key": {"k"}, "X-A": {"zzzz"}, "x-api-key": {"lower"}, "Proxy-Authorization": {""},
		}},
		{"lengths before bytes", "https://api.example/v1", http.Header{
			"X-A": {"b", "aa"}, "Cookie": {"z"}, "X-Api-Key": {"a"},
		}},
		{"user info and query", "https://u:p@api.example/v1?token=t1&token=t0&x=1", http.Header{"Cookie": {"c"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := url.Parse(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			want := c.refAppendCredentials([]byte("prefix"), &http.Request{URL: u, Header: tt.header})
			for range 20 { // maps iterate at random: the order must not show
				h := http.Header{}
				for k, vs := range tt.header {
					h[k] = vs
				}
				got := c.credentialsOf([]byte("prefix"), &http.Request{URL: u, Header: h})
				if !bytes.Equal(got, want) {
					t.Fatalf("got %q\nwant %q", got, want)
				}
			}
		})
	}
	if raceEnabled {
		return
	}
	req := &http.Request{URL: &url.URL{Scheme: "https", Host: "api.example"},
		Header: http.Header{"Authorization": {"Bearer sk_1"}, "Cookie": {"a=1"}, "Content-Type": {"application/json"}}}
	var space [512]byte
	if a := testing.AllocsPerRun(100, func() { c.credentialsOf(space[:0], req) }); a != 0 {
		t.Errorf("appendCredentials allocates %v times with two credential headers, want 0", a)
	}
}
