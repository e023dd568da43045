package idem

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	max := time.Duration(1<<63 - 1)
	tests := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"  7 ", 7 * time.Second, true},
		{"120", 2 * time.Minute, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"5s", 0, false},
		{"soon", 0, false},
		{"99999999999", max, true},
		{"999999999999999999999999999", max, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{"Sunday, 29-Nov-26 12:00:30 GMT", 30 * time.Second, true}, // RFC 850
		{"Sun Nov 29 12:00:45 2026", 45 * time.Second, true},       // asctime
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"Sun, 32 Nov 2026 12:00:00 GMT", 0, false},
	}
	for _, tt := range tests {
		got, ok := retryAfter(tt.in, now)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

func FuzzRetryAfter(f *testing.F) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, s := range []string{"", "0", "120", "-3", "1e9", "99999999999999999999", "Sun, 29 Nov 2026 12:01:00 GMT", "\x00", strings.Repeat("9", 400)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := retryAfter(s, now)
		if d < 0 {
			t.Fatalf("retryAfter(%q) = %v: negative wait", s, d)
		}
		if !ok && d != 0 {
			t.Fatalf("retryAfter(%q) = %v but not ok", s, d)
		}
		// A value of digits only is always a valid delay-seconds.
		if s != "" && strings.Trim(s, "0123456789") == "" && !ok {
			t.Fatalf("retryAfter(%q) rejected delay-seconds", s)
		}
	})
}

func TestZeroRetryPolicyIsBounded(t *testing.T) {
	p := RetryPolicy{}.withDefaults()
	if p.MaxAttempts != 4 || p.Initial <= 0 || p.Max < p.Initial || p.MaxElapsed <= 0 || p.RetryAfterCap <= 0 {
		t.Fatalf("zero policy defaults are not bounded: %+v", p)
	}
	b := p.newBackOff()
	for i := 0; i < 50; i++ {
		if d := b.NextBackOff(); d <= 0 || d > p.Max {
			t.Fatalf("backoff %d = %v, want in (0, %v]", i, d, p.Max)
		}
	}
}

// TestServerDelayHuge: a Retry-After-Ms too large for a Duration asks for
// a very long wait, as a huge Retry-After does (the caller caps both); it
// was ignored, so the client retried at once after backoff.
func TestServerDelayHuge(t *testing.T) {
	now := time.Now()
	for _, v := range []string{"99999999999999999999999", "1e99", "Inf"} {
		d, src, ok := serverDelay(http.Header{"Retry-After-Ms": {v}}, now)
		if !ok || src != "Retry-After-Ms" || d < time.Hour {
			t.Errorf("Retry-After-Ms %q: got %v from %q (%v), want a huge wait from Retry-After-Ms", v, d, src, ok)
		}
	}
	for _, v := range []string{"-5", "NaN", "soon"} {
		if d, src, ok := serverDelay(http.Header{"Retry-After-Ms": {v}}, now); ok {
			t.Errorf("Retry-After-Ms %q: got %v from %q, want it ignored", v, d, src)
		}
	}
}
