package idem

import (
	"context"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxHistory bounds Operation.History: a store keeps the newest
// MaxHistory attempts of an operation and drops older ones.
const MaxHistory = 16

// MaxReason bounds Attempt.Reason, in bytes.
const MaxReason = 128

// AppendHistory returns h with a appended and its oldest entries dropped
// beyond MaxHistory: the change KeyStore.Attempt makes to History, for
// stores written in Go. It never changes h's backing array (it returns a
// new slice), so a record read earlier that shares it stays as it was.
func AppendHistory(h []Attempt, a Attempt) []Attempt {
	if drop := len(h) + 1 - MaxHistory; drop > 0 {
		h = h[drop:]
	}
	out := make([]Attempt, len(h), len(h)+1)
	copy(out, h)
	a.Owner = "" // History keeps what was sent, not who marked it
	return append(out, a)
}

// recordedReason returns s as an attempt's record keeps its reason
// (Attempt.Reason): valid UTF-8 without control characters, any URL in it
// without its query and fragment, at most MaxReason bytes. A reason
// comes from idem's classifier or the application's, never from a header
// value; cutting URL queries keeps a classifier that quotes an error from
// journaling a secret query parameter.
func recordedReason(s string) string {
	clean := len(s) <= MaxReason && utf8.ValidString(s) && !strings.Contains(s, "://")
	for i := 0; clean && i < len(s); i++ {
		clean = s[i] >= 0x20 && s[i] != 0x7f
	}
	if clean {
		return s // the classifier's own reasons cost nothing
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if strings.Contains(s, "://") {
		words := strings.Fields(s)
		for i, w := range words {
			if strings.Contains(w, "://") {
				words[i] = TrimQuery(w)
			}
		}
		s = strings.Join(words, " ")
	}
	if len(s) <= MaxReason {
		return s
	}
	cut := MaxReason - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// ValidTraceparent reports whether s is a well-formed W3C traceparent
// (https://www.w3.org/TR/trace-context/#traceparent-header): version,
// trace id, parent id and flags in lower-case hex, separated by dashes,
// with neither id all zeros and a version other than ff. The journal
// keeps Operation.Trace only if it is one.
func ValidTraceparent(s string) bool {
	if len(s) < 55 || s[2] != '-' || s[35] != '-' || s[52] != '-' || s[:2] == "ff" {
		return false
	}
	if len(s) > 55 && (s[:2] == "00" || s[55] != '-') {
		return false // version 00 has exactly four fields; later ones may add
	}
	for _, f := range [...]string{s[:2], s[3:35], s[36:52], s[53:55]} {
		for i := range len(f) {
			if c := f[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
	}
	return strings.Trim(s[3:35], "0") != "" && strings.Trim(s[36:52], "0") != ""
}

// traceOf returns the trace context the hooks give for ctx: the first
// well-formed traceparent a TraceContext hook returns, or "". It is
// called only when a hook is set.
func (hs hookSet) traceOf(ctx context.Context) string {
	tp := ""
	hs.each(func(h *Hooks) {
		if tp == "" && h.TraceContext != nil {
			if s := h.TraceContext(ctx); ValidTraceparent(s) {
				tp = s
			}
		}
	})
	return tp
}
