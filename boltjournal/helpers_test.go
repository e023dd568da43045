package boltjournal_test

import (
	"net/http"
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
