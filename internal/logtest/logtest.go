// Package logtest is the tests' slog.Handler that keeps every record it is
// given, with its attributes flattened by name, for tests that check what
// idem logged (the root package's and boltjournal's).
package logtest

import (
	"context"
	"log/slog"
	"sync"
)

// Record is one log record as Records keeps it.
type Record struct {
	Level slog.Level
	Msg   string
	Attrs map[string]slog.Value
}

// Records is a slog.Handler that keeps every record, safe for concurrent
// use. Its zero value is ready to use.
type Records struct {
	mu   sync.Mutex
	recs []Record
}

// Enabled reports true for every level.
func (h *Records) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs returns h: attributes given ahead of records are not kept.
func (h *Records) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup returns h: groups are not kept.
func (h *Records) WithGroup(string) slog.Handler { return h }

// Handle keeps r, its attributes resolved.
func (h *Records) Handle(_ context.Context, r slog.Record) error {
	rec := Record{Level: r.Level, Msg: r.Message, Attrs: map[string]slog.Value{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.Resolve()
		return true
	})
	h.mu.Lock()
	h.recs = append(h.recs, rec)
	h.mu.Unlock()
	return nil
}

// Find returns the records with message msg.
func (h *Records) Find(msg string) []Record {
	var out []Record
	for _, r := range h.All() {
		if r.Msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// All returns every record kept so far, oldest first.
func (h *Records) All() []Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Record(nil), h.recs...)
}

// Len returns how many records were kept.
func (h *Records) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.recs)
}
