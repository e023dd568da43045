package boltjournal_test

import (
	"path/filepath"
	"testing"

	"github.com/idemgo/idem/boltjournal"
	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/storetest"
)

func TestBoltStoreConformance(t *testing.T) {
	paths := map[idemstore.KeyStore]string{}
	open := func(t *testing.T, path string) idemstore.KeyStore {
		s, err := boltjournal.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		paths[s] = path
		return s
	}
	storetest.Run(t, storetest.Config{
		Open: func(t *testing.T) idemstore.KeyStore { return open(t, filepath.Join(t.TempDir(), "journal.db")) },
		Reopen: func(t *testing.T, closed idemstore.KeyStore) idemstore.KeyStore {
			return open(t, paths[closed])
		},
	})
}
