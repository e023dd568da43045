package boltfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem/internal/boltfile"
)

// TestOpenSaysFileNeverCompletedItsFirstCommit: a file of at most
// bbolt's first four pages whose meta pages are torn (a power loss during
// the very first write of a file created in place, as releases before
// this one did) never held a record. Open refuses it as damaged, and
// says that no key was ever in it, so the operator may remove it. A file
// that did commit and was damaged later is not said to be one.
func TestOpenSaysFileNeverCompletedItsFirstCommit(t *testing.T) {
	dir := t.TempDir()
	// bbolt's first write of a new file, torn after its first sector.
	init := filepath.Join(dir, "init.db")
	db, err := bolt.Open(init, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	b, err := os.ReadFile(init)
	require.NoError(t, err)
	ps := os.Getpagesize()
	require.GreaterOrEqual(t, len(b), 4*ps)
	torn := make([]byte, 4*ps)
	copy(torn[:512], b[:512])
	path := filepath.Join(dir, "torn.db")
	require.NoError(t, os.WriteFile(path, torn, 0o600))
	_, err = boltfile.Open(path, options())
	require.ErrorIs(t, err, errCorrupt)
	assert.Contains(t, err.Error(), "never completed its first commit")
	assert.Contains(t, err.Error(), "no key was ever journaled in it")

	// A used file, its first page then zeroed: damage, not a new file.
	used := filepath.Join(dir, "used.db")
	f := open(t, used)
	require.NoError(t, f.Release())
	b, err = os.ReadFile(used)
	require.NoError(t, err)
	require.Greater(t, len(b), 4*ps, "a file that completed a commit outgrows bbolt's first pages")
	clear(b[:2*ps])
	require.NoError(t, os.WriteFile(used, b, 0o600))
	_, err = boltfile.Open(used, options())
	require.ErrorIs(t, err, errCorrupt)
	assert.NotContains(t, err.Error(), "never completed")
}

// TestOpenCreatesWhole: a new file appears at its path only complete (its
// buckets and marker committed), and no temporary file is left behind.
func TestOpenCreatesWhole(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "new.db")
	f := open(t, path)
	require.NoError(t, f.Release())
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1, "only the file: no temporary one left")
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketA, bucketB} {
			assert.NotNil(t, tx.Bucket(b), "bucket %s", b)
		}
		return nil
	}))
}
