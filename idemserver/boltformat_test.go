package idemserver_test

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/internal/codec"
)

// writeFormat2 writes a store file of format 2, the previous release's:
// records by id in the bucket keys, and the bucket expiry indexing them
// by expiry. Each record is done, with fingerprint "fp" and body, and
// expires at t0 plus its index in hours (so the first has expired at
// t0). A record named in damaged gets one bit flipped; one named in
// unindexed has no expiry entry.
func writeFormat2(t *testing.T, path string, ids []string, damaged, unindexed string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		m, err := tx.CreateBucket([]byte("meta"))
		require.NoError(t, err)
		require.NoError(t, m.Put([]byte("format"), []byte("idemserver-bolt-2")))
		keys, err := tx.CreateBucket([]byte("keys"))
		require.NoError(t, err)
		expiry, err := tx.CreateBucket([]byte("expiry"))
		require.NoError(t, err)
		for i, id := range ids {
			exp := t0.Add(time.Duration(i) * time.Hour)
			v := codec.ServerAppend(nil, &codec.ServerRecord{Kind: codec.ServerDone, Expires: exp.UnixNano(), Status: 201,
				Fingerprint: "fp", Header: map[string][]string{"Location": {"/o/" + id}}, Body: []byte("body of " + id)})
			if id == damaged {
				v[len(v)-6] ^= 0x01
			}
			require.NoError(t, keys.Put([]byte(id), v))
			if id != unindexed {
				require.NoError(t, expiry.Put(append(binary.BigEndian.AppendUint64(nil, uint64(exp.UnixNano())), id...), nil))
			}
		}
		return nil
	}))
}

// TestBoltStoreReadsFormat2 opens a file of the previous release: its
// stored answers are still replayed, a damaged one is still refused, and
// the file is in the current format afterwards.
func TestBoltStoreReadsFormat2(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	writeFormat2(t, path, []string{"expired", "a", "b", "damaged", "unindexed"}, "damaged", "unindexed")
	ctx := context.Background()
	for range 2 { // migrated at the first Open, read at the second
		s, err := idemserver.OpenBoltStore(path, nil)
		require.NoError(t, err)
		now := t0.Add(time.Second)
		for _, id := range []string{"a", "b", "unindexed"} {
			c, err := s.Begin(ctx, idemserver.Begin{ID: id, Fingerprint: "fp", Now: now, LeaseUntil: now.Add(time.Minute)})
			require.NoError(t, err, id)
			require.Equal(t, idemserver.StateDone, c.State, id)
			assert.Equal(t, "body of "+id, string(c.Response.Body))
			assert.Equal(t, []string{"/o/" + id}, c.Response.Header["Location"])
		}
		c, err := s.Begin(ctx, idemserver.Begin{ID: "b", Fingerprint: "other", Now: now, LeaseUntil: now.Add(time.Minute)})
		require.NoError(t, err)
		assert.Equal(t, idemserver.StateMismatch, c.State)
		_, err = s.Begin(ctx, idemserver.Begin{ID: "damaged", Fingerprint: "fp", Now: now, LeaseUntil: now.Add(time.Minute)})
		require.ErrorIs(t, err, idem.ErrJournalCorrupt, "a damaged record is refused, never replayed nor run again")
		require.NoError(t, s.Close())
	}

	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	require.NoError(t, err)
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		assert.Equal(t, "idemserver-bolt-4", string(tx.Bucket([]byte("meta")).Get([]byte("format"))))
		assert.Nil(t, tx.Bucket([]byte("keys")), "format 2's buckets are gone")
		assert.Nil(t, tx.Bucket([]byte("expiry")))
		return nil
	}))
	require.NoError(t, db.Close())

	// The expired record is swept, then "a" (expiring at t0+1h).
	s, err := idemserver.OpenBoltStore(path, nil)
	require.NoError(t, err)
	defer s.Close()
	n, err := s.Sweep(ctx, t0.Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	c, err := s.Begin(ctx, idemserver.Begin{ID: "a", Fingerprint: "fp", Now: t0.Add(time.Hour), LeaseUntil: t0.Add(2 * time.Hour)})
	require.NoError(t, err)
	assert.Equal(t, idemserver.StateAcquired, c.State)
	c, err = s.Begin(ctx, idemserver.Begin{ID: "b", Fingerprint: "fp", Now: t0.Add(time.Hour), LeaseUntil: t0.Add(2 * time.Hour)})
	require.NoError(t, err)
	assert.Equal(t, idemserver.StateDone, c.State)
}

// TestBoltStoreDamagedIndexEntry: an index entry too short to hold an
// expiry and a hash can only come from damage; Open refuses the file
// rather than build an index without that key (whose request would run
// again).
func TestBoltStoreDamagedIndexEntry(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	s, err := idemserver.OpenBoltStore(path, nil)
	require.NoError(t, err)
	completeDone(t, s, "ok")
	require.NoError(t, s.Close())
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("index")).Put([]byte("short"), []byte{1})
	}))
	require.NoError(t, db.Close())

	_, err = idemserver.OpenBoltStore(path, nil)
	require.ErrorIs(t, err, idem.ErrJournalCorrupt)
	assert.Contains(t, err.Error(), "index entry of 5 bytes")
}

// TestBoltStoreReadsFormat3 opens a file of format 3, records in expiry
// order without the index bucket: its answers are replayed, and the file
// is in the current format afterwards, with one index entry per record.
func TestBoltStoreReadsFormat3(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	ids := []string{"expired", "a", "b"}
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		m, err := tx.CreateBucket([]byte("meta"))
		require.NoError(t, err)
		require.NoError(t, m.Put([]byte("format"), []byte("idemserver-bolt-3")))
		recs, err := tx.CreateBucket([]byte("records"))
		require.NoError(t, err)
		for i, id := range ids {
			exp := t0.Add(time.Duration(i) * time.Hour)
			v := codec.ServerAppend(nil, &codec.ServerRecord{Kind: codec.ServerDone, Expires: exp.UnixNano(), Status: 201,
				Fingerprint: "fp", Header: map[string][]string{"Location": {"/o/" + id}}, Body: []byte("body of " + id)})
			require.NoError(t, recs.Put(append(binary.BigEndian.AppendUint64(nil, uint64(exp.UnixNano())), id...), v))
		}
		return nil
	}))
	require.NoError(t, db.Close())
	ctx := context.Background()
	for range 2 { // migrated at the first Open, read at the second
		s, err := idemserver.OpenBoltStore(path, nil)
		require.NoError(t, err)
		now := t0.Add(time.Second)
		for _, id := range []string{"a", "b"} {
			c, err := s.Begin(ctx, idemserver.Begin{ID: id, Fingerprint: "fp", Now: now, LeaseUntil: now.Add(time.Minute)})
			require.NoError(t, err, id)
			require.Equal(t, idemserver.StateDone, c.State, id)
			assert.Equal(t, "body of "+id, string(c.Response.Body))
		}
		c, err := s.Begin(ctx, idemserver.Begin{ID: "expired", Fingerprint: "fp", Now: now, LeaseUntil: now.Add(time.Minute)})
		require.NoError(t, err)
		assert.Equal(t, idemserver.StateAcquired, c.State)
		require.NoError(t, s.Close())
	}
	db, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		assert.Equal(t, "idemserver-bolt-4", string(tx.Bucket([]byte("meta")).Get([]byte("format"))))
		assert.Equal(t, len(ids), tx.Bucket([]byte("index")).Stats().KeyN)
		return nil
	}))
}
