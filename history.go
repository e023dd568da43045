package idem

import (
	"context"
	"strings"
	"unicode"
	"unicode/utf8"
)

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
