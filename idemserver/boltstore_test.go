package idemserver_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/idemserver/storetest"
)

func openBolt(t *testing.T) idemserver.Store {
	t.Helper()
	s, err := idemserver.OpenBoltStore(filepath.Join(t.TempDir(), "keys.db"), nil)
	require.NoError(t, err)
	return s
}

func TestBoltStore(t *testing.T) {
	storetest.Run(t, storetest.Config{Open: openBolt})
}

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// completeWith claims the new key id at t0 (fingerprint "fp") and
// completes it with resp, kept for an hour.
func completeWith(t *testing.T, s idemserver.Store, id string, resp *idemserver.Response) {
	t.Helper()
	ctx := context.Background()
	c, err := s.Begin(ctx, idemserver.Begin{ID: id, Fingerprint: "fp", Now: t0, LeaseUntil: t0.Add(time.Minute)})
	require.NoError(t, err)
	require.Equal(t, idemserver.StateAcquired, c.State)
	require.NoError(t, s.Complete(ctx, idemserver.Completion{ID: id, Token: c.Token, Response: resp, Now: t0, Until: t0.Add(time.Hour)}))
}

// completeDone stores a 201 of body with a Location for the key "done"
// (see completeWith) and returns the stored response.
func completeDone(t *testing.T, s idemserver.Store, body string) *idemserver.Response {
	t.Helper()
	resp := &idemserver.Response{Status: 201, Header: map[string][]string{"Location": {"/o/1"}}, Body: []byte(body)}
	completeWith(t, s, "done", resp)
	return resp
}

func TestBoltStoreSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	ctx := context.Background()
	s, err := idemserver.OpenBoltStore(path, nil)
	require.NoError(t, err)
	resp := completeDone(t, s, "ok")
	_, err = s.Begin(ctx, idemserver.Begin{ID: "held", Fingerprint: "fp", Now: t0, LeaseUntil: t0.Add(time.Minute)})
	require.NoError(t, err)
	require.NoError(t, s.Close())

	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "store file mode")

	s, err = idemserver.OpenBoltStore(path, nil)
	require.NoError(t, err)
	defer s.Close()
	c, err := s.Begin(ctx, idemserver.Begin{ID: "done", Fingerprint: "fp", Now: t0.Add(2 * time.Minute), LeaseUntil: t0.Add(3 * time.Minute)})
	require.NoError(t, err)
	require.Equal(t, idemserver.StateDone, c.State)
	assert.Equal(t, resp, c.Response)
	// A key in flight lived in the closed process only: it is free.
	c, err = s.Begin(ctx, idemserver.Begin{ID: "held", Fingerprint: "fp", Now: t0.Add(time.Second), LeaseUntil: t0.Add(time.Minute)})
	require.NoError(t, err)
	assert.Equal(t, idemserver.StateAcquired, c.State)
}

func TestOpenBoltStoreErrors(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.db")
	require.NoError(t, os.WriteFile(garbage, make([]byte, 64<<10), 0o600))
	random := filepath.Join(dir, "random.db")
	b := make([]byte, 32<<10)
	for i := range b {
		b[i] = byte(i*7 + i/13)
	}
	require.NoError(t, os.WriteFile(random, b, 0o600))

	// A journal of the idem client is a bbolt file, but not a store.
	journal := filepath.Join(dir, "journal.db")
	c, err := idem.Open(journal)
	require.NoError(t, err)
	require.NoError(t, c.Close())

	// A store cut short after its first pages.
	truncated := filepath.Join(dir, "truncated.db")
	s, err := idemserver.OpenBoltStore(truncated, nil)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, os.Truncate(truncated, 4096*2))

	// A store emptied by a failed copy or restore: refused, not taken
	// for a new store (which would forget every key).
	emptied := filepath.Join(dir, "emptied.db")
	require.NoError(t, os.WriteFile(emptied, nil, 0o600))

	// A store of the earlier release, whose records carry no checksum.
	earlier := filepath.Join(dir, "earlier.db")
	db, err := bolt.Open(earlier, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		m, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		return m.Put([]byte("format"), []byte("idemserver-bolt-1"))
	}))
	require.NoError(t, db.Close())

	locked := filepath.Join(dir, "locked.db")
	holder, err := idemserver.OpenBoltStore(locked, nil)
	require.NoError(t, err)
	defer holder.Close()

	tests := []struct {
		name string
		path string
		want error
	}{
		{"zeros", garbage, idem.ErrJournalCorrupt},
		{"random bytes", random, idem.ErrJournalCorrupt},
		{"idem client journal", journal, idem.ErrJournalCorrupt},
		{"truncated", truncated, idem.ErrJournalCorrupt},
		{"emptied", emptied, idem.ErrJournalCorrupt},
		{"earlier release", earlier, idem.ErrJournalCorrupt},
		{"locked by another handle", locked, idem.ErrJournalLocked},
		{"missing directory", filepath.Join(dir, "no", "such", "dir", "keys.db"), idem.ErrJournalWrite},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := idemserver.OpenBoltStore(tt.path, &idemserver.BoltOptions{LockTimeout: 50 * time.Millisecond})
			if err == nil {
				s.Close()
			}
			require.ErrorIs(t, err, tt.want)
			assert.Contains(t, err.Error(), tt.path)
			if tt.path == earlier {
				assert.Contains(t, err.Error(), "earlier idemserver", "says what the file is and what to do")
			}
		})
	}
}

// TestBoltStoreDamagedRecord flips one bit of a stored response: the
// store reports it as corrupt instead of replaying it.
func TestBoltStoreDamagedRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	ctx := context.Background()
	s, err := idemserver.OpenBoltStore(path, nil)
	require.NoError(t, err)
	completeDone(t, s, `{"amount":100}`)
	require.NoError(t, s.Close())

	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		// The one record holding the body, wherever the format keeps it.
		damaged := 0
		err := tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
			var key []byte
			b.ForEach(func(k, v []byte) error {
				if bytes.Contains(v, []byte("100")) {
					key = k
				}
				return nil
			})
			if key == nil {
				return nil
			}
			v := append([]byte(nil), b.Get(key)...)
			i := bytes.Index(v, []byte("100"))
			v[i] ^= 0x01 // "100" becomes "000": one bit, a silent change of amount
			damaged++
			return b.Put(key, v)
		})
		require.Equal(t, 1, damaged)
		return err
	}))
	require.NoError(t, db.Close())

	s, err = idemserver.OpenBoltStore(path, nil)
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Begin(ctx, idemserver.Begin{ID: "done", Fingerprint: "fp", Now: t0.Add(time.Second), LeaseUntil: t0.Add(time.Minute)})
	assert.ErrorIs(t, err, idem.ErrJournalCorrupt)
}
