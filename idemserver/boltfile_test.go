package idemserver_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
)

// The store's file handling is the idem journal's (internal/boltfile):
// these tests prove what the store gained from it.

// complete stores a 201 of body for the new key id (see completeWith).
func complete(t *testing.T, s idemserver.Store, id string, body []byte) {
	t.Helper()
	completeWith(t, s, id, &idemserver.Response{Status: 201, Header: map[string][]string{}, Body: body})
}

func TestOpenBoltStoreRefusesPathsLikeTheJournal(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "dir.db"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "plain"), []byte("x"), 0o600))
	for _, tc := range []struct{ name, path string }{
		{"empty path", ""},
		{"directory", filepath.Join(dir, "dir.db")},
		{"parent is a file", filepath.Join(dir, "plain", "keys.db")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := idemserver.OpenBoltStore(tc.path, nil)
			if err == nil {
				s.Close()
			}
			require.ErrorIs(t, err, idem.ErrJournalWrite)
			assert.NotErrorIs(t, err, idem.ErrJournalCorrupt, "the file is not damaged: it cannot be opened for writing")
		})
	}
}

func TestBoltStoreReplacedUnderIt(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.db")
	s, err := idemserver.OpenBoltStore(path, nil)
	require.NoError(t, err)
	complete(t, s, "a", []byte("ok"))
	other, err := idemserver.OpenBoltStore(filepath.Join(dir, "other.db"), nil)
	require.NoError(t, err)
	require.NoError(t, other.Close())
	require.NoError(t, os.Rename(filepath.Join(dir, "other.db"), path))

	// A completion written to the unlinked file would be lost at restart,
	// and the retry of a charge would run its handler again.
	ctx := context.Background()
	c, err := s.Begin(ctx, idemserver.Begin{ID: "b", Fingerprint: "fp", Now: t0, LeaseUntil: t0.Add(time.Minute)})
	require.NoError(t, err)
	err = s.Complete(ctx, idemserver.Completion{ID: "b", Token: c.Token, Response: &idemserver.Response{Status: 201}, Now: t0, Until: t0.Add(time.Hour)})
	require.ErrorIs(t, err, idem.ErrJournalWrite)
	assert.Contains(t, err.Error(), "removed or replaced")
	err = s.Close()
	require.ErrorIs(t, err, idem.ErrJournalWrite, "Close reports the store replaced under it")
}

func TestBoltStoreOverwrittenWithAnOlderCopy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	s, err := idemserver.OpenBoltStore(path, nil)
	require.NoError(t, err)
	complete(t, s, "a", []byte("ok"))
	backup, err := os.ReadFile(path)
	require.NoError(t, err)
	complete(t, s, "b", []byte("ok"))
	complete(t, s, "c", []byte("ok"))

	// An operator restores the backup over the open file, in place.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(backup, 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	// b's stored response vanished: answering "acquired" would run the
	// handler a second time.
	_, err = s.Begin(context.Background(), idemserver.Begin{ID: "b", Fingerprint: "fp", Now: t0.Add(time.Second), LeaseUntil: t0.Add(time.Minute)})
	require.ErrorIs(t, err, idem.ErrJournalCorrupt)
	assert.Contains(t, err.Error(), "older copy")
	require.ErrorIs(t, s.Close(), idem.ErrJournalCorrupt, "Close reports it too")
}

func TestBoltStoreDamagedPageDuringWrite(t *testing.T) {
	// A page damaged under a running store: the commit that reads it fails
	// with idem.ErrJournalCorrupt, not idem.ErrJournalWrite and an untyped panic message.
	path := filepath.Join(t.TempDir(), "keys.db")
	s, err := idemserver.OpenBoltStore(path, nil)
	require.NoError(t, err)
	defer s.Close()
	for i := range 200 {
		complete(t, s, fmt.Sprintf("key-%03d", i), bytes.Repeat([]byte("z"), 300))
	}
	ctx := context.Background()
	c, err := s.Begin(ctx, idemserver.Begin{ID: "key-100x", Fingerprint: "fp", Now: t0, LeaseUntil: t0.Add(time.Minute)})
	require.NoError(t, err)

	// Overwrite every page but the meta pages in place, behind bbolt's
	// back, with bytes that are no page type bbolt knows.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	fi, err := f.Stat()
	require.NoError(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte{0xA5}, int(fi.Size())-8192), 8192)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	err = s.Complete(ctx, idemserver.Completion{ID: "key-100x", Token: c.Token, Response: &idemserver.Response{Status: 201}, Now: t0, Until: t0.Add(time.Hour)})
	require.ErrorIs(t, err, idem.ErrJournalCorrupt)
	assert.NotErrorIs(t, err, idem.ErrJournalWrite)
}

func TestBoltStoreCompactsAtOpen(t *testing.T) {
	// A burst of large responses, all expired and swept: the file keeps
	// their pages (free now) until Open finds it mostly free and compacts
	// it. The path is a symbolic link, and stays one.
	dir := t.TempDir()
	target := filepath.Join(dir, "keys-target.db")
	path := filepath.Join(dir, "keys.db")
	require.NoError(t, os.Symlink(target, path))
	s, err := idemserver.OpenBoltStore(path, nil)
	require.NoError(t, err)
	big := bytes.Repeat([]byte("b"), 1<<20)
	for i := range 20 {
		complete(t, s, fmt.Sprintf("big-%02d", i), big)
	}
	n, err := s.Sweep(context.Background(), t0.Add(2*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 20, n)
	complete(t, s, "kept", []byte("ok"))
	require.NoError(t, s.Close())
	before, err := os.Stat(target)
	require.NoError(t, err)
	require.GreaterOrEqual(t, before.Size(), int64(16<<20), "the burst left too small a file to be compacted")

	s, err = idemserver.OpenBoltStore(path, nil)
	require.NoError(t, err)
	defer s.Close()
	after, err := os.Stat(target)
	require.NoError(t, err)
	assert.Less(t, after.Size(), before.Size()/4, "the link's target was compacted")
	fi, err := os.Lstat(path)
	require.NoError(t, err)
	assert.NotZero(t, fi.Mode()&os.ModeSymlink, "the path stays a link")
	_, err = os.Stat(target + ".compact")
	assert.ErrorIs(t, err, os.ErrNotExist, "no temporary file left")

	c, err := s.Begin(context.Background(), idemserver.Begin{ID: "kept", Fingerprint: "fp", Now: t0.Add(time.Second), LeaseUntil: t0.Add(time.Minute)})
	require.NoError(t, err)
	require.Equal(t, idemserver.StateDone, c.State)
	assert.Equal(t, []byte("ok"), c.Response.Body)
	complete(t, s, "after", []byte("ok"))
}
