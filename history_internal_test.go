package idem

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestRecordedReason(t *testing.T) {
	for in, want := range map[string]string{
		"503":             "503",
		"409 in progress": "409 in progress",
		"bad\x00\nline":   "bad  line",
		"\xffoops":        "\uFFFDoops",
		"Post \"https://api.example.com/v1/charges?token=s3cret&x=1#f\": EOF": "Post \"https://api.example.com/v1/charges EOF",
	} {
		if got := recordedReason(in); got != want {
			t.Errorf("recordedReason(%q) = %q, want %q", in, got, want)
		}
	}
	long := recordedReason(strings.Repeat("é", 200))
	if len(long) > MaxReason || !utf8.ValidString(long) || !strings.HasSuffix(long, "…") {
		t.Errorf("a long reason: %d bytes %q", len(long), long)
	}
}
