package idem_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, storetest.Config{
		Open: func(t *testing.T) idem.KeyStore { return idem.NewMemoryStore() },
	})
}

// opTime is when the operations of newOp were made.
var opTime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newOp(key string) idem.Operation {
	return idem.Operation{
		Key: key, Method: http.MethodPost, URL: "https://api.example.com/v1/charges",
		Fingerprint: [32]byte{1, byte(len(key))},
		Owner:       "test",
		State:       idem.StatePending, Created: opTime, Updated: opTime,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"amount":42,"key":"` + key + `"}`),
	}
}

func mustReserve(t *testing.T, s idem.KeyStore, op idem.Operation) idem.Operation {
	t.Helper()
	rec, created, err := s.Reserve(t.Context(), op)
	if err != nil || !created {
		t.Fatalf("Reserve(%s): created=%v err=%v, want a new record", op.Key, created, err)
	}
	return rec
}
