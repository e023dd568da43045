package boltjournal_test

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/idemstore"
)

// The helpers below are those of the root package's tests, which these
// tests shared while the journal lived there.

// opTime is when the operations of newOp were made.
var opTime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newOp(key string) idemstore.Operation {
	return idemstore.Operation{
		Key: key, Method: http.MethodPost, URL: "https://api.example.com/v1/charges",
		Fingerprint: [32]byte{1, byte(len(key))},
		Owner:       "test",
		State:       idemstore.StatePending, Created: opTime, Updated: opTime,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"amount":42,"key":"` + key + `"}`),
	}
}

func mustReserve(t *testing.T, s idemstore.KeyStore, op idemstore.Operation) idemstore.Operation {
	t.Helper()
	rec, created, err := s.Reserve(t.Context(), op)
	if err != nil || !created {
		t.Fatalf("Reserve(%s): created=%v err=%v, want a new record", op.Key, created, err)
	}
	return rec
}

func keys(ops []idemstore.Operation) []string {
	var ks []string
	for _, op := range ops {
		ks = append(ks, op.Key)
	}
	return ks
}

// logRecords is a slog.Handler that keeps every record, with its
// attributes flattened by name.
type logRecords struct {
	mu   sync.Mutex
	recs []logRecord
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]slog.Value
}

func (h *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecords) WithGroup(string) slog.Handler            { return h }
func (h *logRecords) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]slog.Value{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Resolve()
		return true
	})
	h.mu.Lock()
	h.recs = append(h.recs, rec)
	h.mu.Unlock()
	return nil
}

// find returns the records with message msg.
func (h *logRecords) find(msg string) []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logRecord
	for _, r := range h.recs {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}
