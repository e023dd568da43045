package idemstore

import "strings"

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
