package pgstore

import (
	"encoding/json"
	"strings"

	"github.com/idemgo/idem/idemstore"
)

// histEntry is one attempt of the history column, a JSON array.
type histEntry struct {
	At     int64  `json:"at"`
	Sent   int    `json:"sent"`
	Status int    `json:"status,omitempty"`
	Err    string `json:"err,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// encodeEntry returns a as one entry of the history column. The journal
// passes text without NUL bytes; one that slipped through would make
// PostgreSQL refuse the JSON (jsonb has no \u0000), so it becomes U+FFFD.
func encodeEntry(a idemstore.Attempt) ([]byte, error) {
	e := entryOf(a)
	e.Err, e.Reason = strings.ReplaceAll(e.Err, "\x00", "\uFFFD"), strings.ReplaceAll(e.Reason, "\x00", "\uFFFD")
	return json.Marshal(e)
}

// entryOf returns a as an entry of the history column, its text as it is.
func entryOf(a idemstore.Attempt) histEntry {
	return histEntry{At: nanos(a.At), Sent: a.Sent, Status: a.Status, Err: a.Err, Reason: a.Reason}
}

// encodeHistory returns h as the history column, or nil (NULL) for none.
func encodeHistory(h []idemstore.Attempt) ([]byte, error) {
	if len(h) == 0 {
		return nil, nil
	}
	es := make([]histEntry, len(h))
	for i, a := range h {
		es[i] = entryOf(a)
	}
	return json.Marshal(es)
}

// decodeHistory reads the history column; NULL and [] are no history.
func decodeHistory(b []byte) ([]idemstore.Attempt, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var es []histEntry
	if err := json.Unmarshal(b, &es); err != nil {
		return nil, err
	}
	if len(es) == 0 {
		return nil, nil
	}
	h := make([]idemstore.Attempt, len(es))
	for i, e := range es {
		h[i] = idemstore.Attempt{At: fromNanos(e.At), Sent: e.Sent, Status: e.Status, Err: e.Err, Reason: e.Reason}
	}
	return h, nil
}
