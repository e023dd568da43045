package fingerprint

import (
	"net/http"
	"testing"
)

func TestSumDistinguishesPayloads(t *testing.T) {
	base := func() (string, string, http.Header, []byte) {
		return "POST", "https://api.example.com/v1/charges", http.Header{"Content-Type": {"application/json"}}, []byte(`{"amount":100}`)
	}
	m, u, h, b := base()
	want := Sum(m, u, h, b)
	if got := Sum(m, u, h.Clone(), append([]byte(nil), b...)); got != want {
		t.Fatalf("same input, different sums: %x vs %x", got, want)
	}
	h2 := h.Clone()
	h2.Set("Authorization", "Bearer x")
	h2.Set("User-Agent", "other")
	if got := Sum(m, u, h2, b); got != want {
		t.Fatalf("non-payload headers changed the sum")
	}
	tests := []struct {
		name string
		mod  func(m, u *string, h http.Header, b *[]byte)
	}{
		{"method", func(m, u *string, h http.Header, b *[]byte) { *m = "PATCH" }},
		{"url", func(m, u *string, h http.Header, b *[]byte) { *u += "?x=1" }},
		{"body", func(m, u *string, h http.Header, b *[]byte) { *b = []byte(`{"amount":101}`) }},
		{"content type", func(m, u *string, h http.Header, b *[]byte) { h.Set("Content-Type", "text/plain") }},
		{"content encoding", func(m, u *string, h http.Header, b *[]byte) { h.Set("Content-Encoding", "gzip") }},
		{"boundary shift", func(m, u *string, h http.Header, b *[]byte) { *m, *u = "POSThttps://api.example.com", "/v1/charges" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, u, h, b := base()
			tt.mod(&m, &u, h, &b)
			if got := Sum(m, u, h, b); got == want {
				t.Fatalf("changing the %s did not change the sum", tt.name)
			}
		})
	}
}
