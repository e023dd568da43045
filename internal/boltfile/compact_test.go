package boltfile_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem/internal/boltfile"
)

// mostlyFree writes a file of more than boltfile.CompactMinSize bytes
// whose pages are mostly free, with one key left in bucket a.
func mostlyFree(t *testing.T, path string) int64 {
	t.Helper()
	f := open(t, path)
	big := make([]byte, 1<<20)
	for i := range 20 {
		require.NoError(t, f.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketB).Put(fmt.Appendf(nil, "big-%02d", i), big)
		}))
	}
	require.NoError(t, f.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketA).Put([]byte("kept"), []byte("v")); err != nil {
			return err
		}
		return tx.DeleteBucket(bucketB)
	}))
	require.NoError(t, f.Release())
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.GreaterOrEqual(t, fi.Size(), int64(boltfile.CompactMinSize), "too small a file to be compacted")
	return fi.Size()
}

func TestCompactAtOpen(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target.db")
	link := filepath.Join(dir, "link.db")
	require.NoError(t, os.Symlink(target, link))
	before := mostlyFree(t, link)

	o := options()
	o.Compact = true
	hooked := 0
	o.BeforeCompact = func() { hooked++ }
	f, err := boltfile.Open(link, o)
	require.NoError(t, err)
	assert.Equal(t, 1, hooked)
	require.NoError(t, f.StillNamed(), "the handle holds the compacted file, now at the path")
	require.NoError(t, f.View(func(tx *bolt.Tx) error {
		assert.Equal(t, []byte("v"), tx.Bucket(bucketA).Get([]byte("kept")))
		return nil
	}))
	require.NoError(t, f.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketA).Put([]byte("after"), []byte("v")) }))
	require.NoError(t, f.Release())

	fi, err := os.Stat(target)
	require.NoError(t, err)
	assert.Less(t, fi.Size(), before/4, "the link's target was compacted")
	fi, err = os.Lstat(link)
	require.NoError(t, err)
	assert.NotZero(t, fi.Mode()&os.ModeSymlink, "the link stays a link")
	_, err = os.Stat(target + ".compact")
	assert.ErrorIs(t, err, os.ErrNotExist, "no temporary file left")

	f = open(t, link)
	defer f.Release()
	require.NoError(t, f.View(func(tx *bolt.Tx) error {
		assert.Equal(t, []byte("v"), tx.Bucket(bucketA).Get([]byte("after")))
		return nil
	}))
}

func TestNoCompactionUnlessAsked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	before := mostlyFree(t, path)
	o := options()
	o.BeforeCompact = func() { t.Error("compacted without Options.Compact") }
	f, err := boltfile.Open(path, o)
	require.NoError(t, err)
	require.NoError(t, f.Release())
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, before, fi.Size())
}
