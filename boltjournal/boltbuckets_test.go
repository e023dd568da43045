package boltjournal_test

import (
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem/boltjournal"
	"github.com/idemgo/idem/idemstore"
)

// TestLostBucketIsDamage: a journal whose ops or names bucket was deleted
// is ErrJournalCorrupt for a writable Open and a read-only one alike, and
// neither writes to it (a writable Open used to give it an empty bucket
// and go on, its pending operations forgotten).
func TestLostBucketIsDamage(t *testing.T) {
	for _, bucket := range []string{"ops", "names"} {
		t.Run(bucket, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			s, err := boltjournal.Open(path, nil)
			require.NoError(t, err)
			now := time.Now()
			_, _, err = s.Reserve(context.Background(), idemstore.Operation{Key: "00000000-0000-7000-8000-000000000001",
				Method: "POST", URL: "https://pay.example/x", State: idemstore.StatePending, Created: now, Updated: now})
			require.NoError(t, err)
			require.NoError(t, s.Close())
			db, err := bolt.Open(path, 0o600, nil)
			require.NoError(t, err)
			require.NoError(t, db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte(bucket)) }))
			require.NoError(t, db.Close())
			raw, err := os.ReadFile(path)
			require.NoError(t, err)
			before := sha256.Sum256(raw)

			for _, o := range []*boltjournal.Options{nil, {ReadOnly: true}, {ReadOnly: true, SkipCheck: true}} {
				_, err := boltjournal.Open(path, o)
				assert.ErrorIs(t, err, idemstore.ErrJournalCorrupt, "options %+v", o)
				assert.ErrorContains(t, err, "no "+bucket+" bucket")
			}
			raw, err = os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, before, sha256.Sum256(raw), "Open wrote to the damaged journal")
		})
	}
}
