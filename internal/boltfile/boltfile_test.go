package boltfile_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem/internal/boltfile"
)

// The caller's sentinels: every error of a File matches exactly one.
var (
	errLocked  = errors.New("test: locked")
	errCorrupt = errors.New("test: corrupt")
	errWrite   = errors.New("test: write")
	errClosed  = errors.New("test: closed")
	errVersion = errors.New("test: other version")
	sentinels  = []error{errLocked, errCorrupt, errWrite, errClosed, errVersion}
)

var (
	bucketMeta = []byte("meta")
	bucketA    = []byte("a")
	bucketB    = []byte("b")
)

func options() boltfile.Options {
	return boltfile.Options{
		Kind:        "thing",
		Foreign:     "a test thing",
		Errors:      boltfile.Errors{Locked: errLocked, Corrupt: errCorrupt, Write: errWrite, Closed: errClosed},
		LockTimeout: 50 * time.Millisecond,
		Meta:        bucketMeta,
		FormatKey:   []byte("format"),
		Marker:      []byte("thing/2"),
		CheckFormat: func(got []byte) error {
			switch {
			case string(got) == "thing/2":
				return nil
			case strings.HasPrefix(string(got), "thing/"):
				return fmt.Errorf("%w: format %s", errVersion, got)
			}
			return fmt.Errorf("%w: marker %q", errCorrupt, got)
		},
		Buckets: [][]byte{bucketA, bucketB},
	}
}

func open(t *testing.T, path string) *boltfile.File {
	t.Helper()
	f, err := boltfile.Open(path, options())
	require.NoError(t, err)
	return f
}

// only asserts that err matches want and no other sentinel.
func only(t *testing.T, err, want error) {
	t.Helper()
	require.ErrorIs(t, err, want)
	for _, other := range sentinels {
		if other != want {
			assert.NotErrorIs(t, err, other)
		}
	}
}

// bboltFile writes a plain bbolt file at path with fn's changes.
func bboltFile(t *testing.T, path string, fn func(*bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(fn))
	require.NoError(t, db.Close())
}

// markedFile writes a bbolt file at path with only the meta bucket, which
// holds marker as its format marker.
func markedFile(t *testing.T, path, marker string) {
	t.Helper()
	bboltFile(t, path, func(tx *bolt.Tx) error {
		m, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		return m.Put([]byte("format"), []byte(marker))
	})
}

func TestOpenNewFileGetsMarkerAndBuckets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	f := open(t, path)
	assert.True(t, f.Modified().IsZero(), "a new file has no modification time of before")
	require.NoError(t, f.View(func(tx *bolt.Tx) error {
		assert.Equal(t, []byte("thing/2"), tx.Bucket(bucketMeta).Get([]byte("format")))
		assert.NotNil(t, tx.Bucket(bucketA))
		assert.NotNil(t, tx.Bucket(bucketB))
		return nil
	}))
	require.NoError(t, f.Release())
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
}

func TestOpenOfAReadyFileOnlyReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	require.NoError(t, open(t, path).Release())
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	f := open(t, path)
	assert.Equal(t, fi.ModTime(), f.Modified())
	require.NoError(t, f.Release())
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after, "Open wrote to a ready file")
}

func TestOpenAddsMissingBuckets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	markedFile(t, path, "thing/2")
	f := open(t, path)
	defer f.Release()
	require.NoError(t, f.View(func(tx *bolt.Tx) error {
		assert.NotNil(t, tx.Bucket(bucketA))
		assert.NotNil(t, tx.Bucket(bucketB))
		return nil
	}))
}

func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }

	require.NoError(t, os.WriteFile(path("empty.db"), nil, 0o600))
	require.NoError(t, os.WriteFile(path("zeros.db"), make([]byte, 64<<10), 0o600))
	require.NoError(t, os.Mkdir(path("dir.db"), 0o700))
	require.NoError(t, os.WriteFile(path("plain"), []byte("x"), 0o600))
	bboltFile(t, path("foreign.db"), func(tx *bolt.Tx) error {
		_, err := tx.CreateBucket([]byte("theirs"))
		return err
	})
	markedFile(t, path("newer.db"), "thing/3")
	markedFile(t, path("marker.db"), "something else")
	require.NoError(t, open(t, path("truncated.db")).Release())
	require.NoError(t, os.Truncate(path("truncated.db"), 4096*2))
	holder := open(t, path("locked.db"))
	defer holder.Release()

	for _, tc := range []struct {
		name, path string
		want       error
		says       string
	}{
		{"empty path", "", errWrite, "empty path"},
		{"emptied file", path("empty.db"), errCorrupt, "a thing that lost its contents"},
		{"zeros", path("zeros.db"), errCorrupt, ""},
		{"directory", path("dir.db"), errWrite, "directory"},
		{"missing directory", path("no/such/x.db"), errWrite, "cannot create it"},
		{"parent is a file", path("plain/x.db"), errWrite, "not a directory"},
		{"foreign bbolt file", path("foreign.db"), errCorrupt, "not a test thing"},
		{"marker of another version", path("newer.db"), errVersion, "thing/3"},
		{"other marker", path("marker.db"), errCorrupt, "something else"},
		{"truncated", path("truncated.db"), errCorrupt, ""},
		{"locked by another handle", path("locked.db"), errLocked, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := boltfile.Open(tc.path, options())
			if err == nil {
				f.Release()
			}
			only(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.says)
		})
	}
	fi, err := os.Stat(path("empty.db"))
	require.NoError(t, err)
	assert.Zero(t, fi.Size(), "the emptied file was left as it was")
}

func TestMarkerCheckedWithoutCheckFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	markedFile(t, path, "thing/1")
	o := options()
	o.CheckFormat = nil
	_, err := boltfile.Open(path, o)
	only(t, err, errCorrupt)
	assert.Contains(t, err.Error(), `thing format marker "thing/1", want "thing/2"`)
}

func TestGuardedTurnsAPanicIntoCorrupt(t *testing.T) {
	f := open(t, filepath.Join(t.TempDir(), "x.db"))
	defer f.Release()
	err := f.Update(func(tx *bolt.Tx) error { panic("bad page") })
	only(t, err, errCorrupt)
	assert.Contains(t, err.Error(), "bad page")
	assert.True(t, f.Broken())
	// Every later access is refused, without touching bbolt.
	only(t, f.View(func(*bolt.Tx) error { return nil }), errCorrupt)
	only(t, f.Guarded(func() error { return nil }), errCorrupt)
}

func TestSalvageRecoversWithoutBreaking(t *testing.T) {
	f := open(t, filepath.Join(t.TempDir(), "x.db"))
	defer f.Release()
	err := f.Salvage(func(tx *bolt.Tx) error { panic("bad page") })
	only(t, err, errCorrupt)
	assert.False(t, f.Broken(), "a read transaction holds no lock: the file stays usable")
	require.NoError(t, f.View(func(*bolt.Tx) error { return nil }))
}

func TestUpdateErrors(t *testing.T) {
	f := open(t, filepath.Join(t.TempDir(), "x.db"))
	defer f.Release()
	mine := errors.New("mine")
	assert.Same(t, mine, f.Update(func(*bolt.Tx) error { return mine }), "fn's error as is")
	require.NoError(t, f.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketA).Put([]byte("k"), []byte("v")) }))
}

func TestViewAfterRelease(t *testing.T) {
	f := open(t, filepath.Join(t.TempDir(), "x.db"))
	require.NoError(t, f.Release())
	only(t, f.View(func(*bolt.Tx) error { return nil }), errClosed)
}

func TestAFileReplacedWhileOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.db")
	f := open(t, path)
	defer f.Release()
	require.NoError(t, f.StillNamed())
	require.NoError(t, open(t, filepath.Join(dir, "other.db")).Release())
	require.NoError(t, os.Rename(filepath.Join(dir, "other.db"), path))

	only(t, f.StillNamed(), errWrite)
	err := f.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketA).Put([]byte("k"), []byte("v")) })
	only(t, err, errWrite)
	assert.Contains(t, err.Error(), "removed or replaced")

	require.NoError(t, os.Remove(path))
	only(t, f.StillNamed(), errWrite)
}

// restoredOverOpen opens a file, writes "a", takes a backup, writes "b"
// and "c", then restores the backup over the open file, in place. It
// returns the open handle and a put that writes one key through it.
func restoredOverOpen(t *testing.T) (*boltfile.File, func(k string) error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "x.db")
	f := open(t, path)
	t.Cleanup(func() { f.Release() })
	put := func(k string) error {
		return f.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketA).Put([]byte(k), []byte("v")) })
	}
	require.NoError(t, put("a"))
	backup, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, put("b"))
	require.NoError(t, put("c"))

	// A backup restored over the open file, in place.
	w, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = w.WriteAt(backup, 0)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return f, put
}

func TestAFileOverwrittenWithAnOlderCopy(t *testing.T) {
	f, put := restoredOverOpen(t)
	err := f.View(func(*bolt.Tx) error { return nil })
	only(t, err, errCorrupt)
	assert.Contains(t, err.Error(), "older copy")
	assert.True(t, f.Broken())
	only(t, put("d"), errCorrupt)
}

func TestAWriteOnAnOlderCopyIsRefused(t *testing.T) {
	_, put := restoredOverOpen(t)

	// The first access after the restore is a write: its transaction ID
	// is not above the ones this handle saw.
	err := put("d")
	only(t, err, errCorrupt)
	assert.Contains(t, err.Error(), "older copy")
}

func TestASymbolicLinkIsFollowed(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target.db")
	link := filepath.Join(dir, "link.db")
	require.NoError(t, os.Symlink(target, link))
	f := open(t, link)
	require.NoError(t, f.StillNamed())
	require.NoError(t, f.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketA).Put([]byte("k"), []byte("v")) }))
	require.NoError(t, f.Release())
	fi, err := os.Lstat(link)
	require.NoError(t, err)
	assert.NotZero(t, fi.Mode()&os.ModeSymlink, "the link stays a link")
	fi, err = os.Stat(target)
	require.NoError(t, err)
	assert.Positive(t, fi.Size(), "the link's target holds the file")
}

func TestMapOpenError(t *testing.T) {
	e := boltfile.Errors{Locked: errLocked, Corrupt: errCorrupt, Write: errWrite, Closed: errClosed}
	for _, tc := range []struct {
		err, want error
	}{
		{fmt.Errorf("open: %w", os.ErrPermission), errWrite},
		{fmt.Errorf("open: %w", os.ErrNotExist), errWrite},
		{errors.New("file size too small"), errCorrupt},
	} {
		got := boltfile.MapOpenError(tc.err, e)
		only(t, got, tc.want)
		assert.ErrorIs(t, got, tc.err, "loses nothing")
	}
}

// fdsOn counts this process's open file descriptors on the file at path.
func fdsOn(t *testing.T, path string) int {
	t.Helper()
	want, err := os.Stat(path)
	require.NoError(t, err)
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd here (%v)", err)
	}
	n := 0
	for _, e := range ents {
		if fi, err := os.Stat(filepath.Join("/proc/self/fd", e.Name())); err == nil && os.SameFile(fi, want) {
			n++
		}
	}
	return n
}

func TestAnOpenerWaitingForAFileThatIsReplacedTakesTheNewOne(t *testing.T) {
	// A holds the file; B waits for its lock; the file is replaced (as a
	// compaction by A does) and A lets go. B got the old file's lock, but
	// that file no longer has the name: B opens the new one.
	dir := t.TempDir()
	path := filepath.Join(dir, "x.db")
	a := open(t, path)
	old := filepath.Join(dir, "old.db")
	require.NoError(t, os.Link(path, old)) // to find B's handle on the old file

	type result struct {
		f   *boltfile.File
		err error
	}
	done := make(chan result, 1)
	go func() {
		o := options()
		o.LockTimeout = time.Minute // bounded; A lets go as soon as B waits
		f, err := boltfile.Open(path, o)
		done <- result{f, err}
	}()
	// B waits once it holds a descriptor of the old file besides A's.
	for i := 0; fdsOn(t, old) < 2; i++ {
		require.Less(t, i, 100000, "B never opened the file")
		select {
		case r := <-done:
			t.Fatalf("B returned before A let go: %v", r.err)
		default:
		}
		time.Sleep(time.Millisecond)
	}

	// The replacement, with a record of its own.
	repl := filepath.Join(dir, "new.db")
	n := open(t, repl)
	require.NoError(t, n.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketA).Put([]byte("new"), []byte("v")) }))
	require.NoError(t, n.Release())
	require.NoError(t, os.Rename(repl, path))
	require.NoError(t, a.Release())

	r := <-done
	require.NoError(t, r.err)
	defer r.f.Release()
	require.NoError(t, r.f.StillNamed(), "B holds the file now at the path")
	require.NoError(t, r.f.View(func(tx *bolt.Tx) error {
		assert.Equal(t, []byte("v"), tx.Bucket(bucketA).Get([]byte("new")))
		return nil
	}))
	assert.Equal(t, 0, fdsOn(t, old), "B let go of the old file")
}
