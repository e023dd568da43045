package idem_test

import (
	"net/http"
	"path/filepath"
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

func TestBoltStoreConformance(t *testing.T) {
	paths := map[idem.KeyStore]string{}
	open := func(t *testing.T, path string) idem.KeyStore {
		s, err := idem.OpenBoltStore(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		paths[s] = path
		return s
	}
	storetest.Run(t, storetest.Config{
		Open: func(t *testing.T) idem.KeyStore { return open(t, filepath.Join(t.TempDir(), "journal.db")) },
		Reopen: func(t *testing.T, closed idem.KeyStore) idem.KeyStore {
			return open(t, paths[closed])
		},
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

func keys(ops []idem.Operation) []string {
	var ks []string
	for _, op := range ops {
		ks = append(ks, op.Key)
	}
	return ks
}
