package boltjournal_test

// Tests of who opens the bbolt journal and which file they get: one opener
// at a time, always the file at the path.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/boltjournal"
	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/crashtest"
)

// mostlyFreeJournal fills a journal at path with a burst of large finished
// requests, so that it is over 16 MiB and mostly free pages: the next Open
// compacts it. It leaves one pending operation, "pending" (pay:pending).
func mostlyFreeJournal(t *testing.T, path string) idemstore.Operation {
	t.Helper()
	s, err := boltjournal.Open(path, nil)
	require.NoError(t, err)
	ctx := t.Context()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				op := newOp(fmt.Sprintf("big-%d-%02d", g, i))
				op.Body = bytes.Repeat([]byte{'x'}, 100<<10)
				if _, _, err := s.Reserve(ctx, op); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for g := range 8 {
		for i := range 25 {
			require.NoError(t, s.Finish(ctx, fmt.Sprintf("big-%d-%02d", g, i), idemstore.Outcome{State: idemstore.StateSucceeded, Status: 201, At: opTime}))
		}
	}
	keep := newOp("pending")
	keep.Name = "pay:pending"
	mustReserve(t, s, keep)
	require.NoError(t, s.Close())
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.GreaterOrEqual(t, fi.Size(), int64(16<<20), "the burst left too small a file to be compacted")
	return keep
}

func init() { crashChildren["open"] = childOpen }

// childOpen is the second opener of TestSecondOpenerDuringCompaction: it
// announces its pid, opens the journal (waiting long for its lock), and
// reports what it finds of the parent's reservation.
func childOpen() int {
	crashtest.Emit("opening", strconv.Itoa(os.Getpid()))
	s, err := boltjournal.Open(os.Getenv("IDEM_JOURNAL"), &boltjournal.Options{LockTimeout: time.Minute})
	if err != nil {
		crashtest.Emit("error", strings.ReplaceAll(err.Error(), "\n", " "))
		return 1
	}
	op, err := s.Get(context.Background(), "parent-key")
	switch {
	case err != nil:
		crashtest.Emit("missing", strings.ReplaceAll(err.Error(), "\n", " "))
	default:
		crashtest.Emit("found", op.State.String())
	}
	if err := s.Close(); err != nil {
		crashtest.Emit("close", err.Error())
	}
	return 0
}

// waitForOpenFile waits until process pid has path open.
func waitForOpenFile(t *testing.T, pid, path string) {
	t.Helper()
	want, err := os.Stat(path)
	require.NoError(t, err)
	for range 10_000 {
		fds, _ := os.ReadDir(filepath.Join("/proc", pid, "fd"))
		for _, fd := range fds {
			if fi, err := os.Stat(filepath.Join("/proc", pid, "fd", fd.Name())); err == nil && os.SameFile(fi, want) {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("process %s never opened %s", pid, path)
}

func TestSecondOpenerDuringCompaction(t *testing.T) {
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("needs /proc to see the second opener's open files")
	}
	path := filepath.Join(t.TempDir(), "journal.db")
	mostlyFreeJournal(t, path)
	var child *crashtest.Child
	s, err := boltjournal.OpenBeforeCompact(path, nil, func() {
		// A second process comes while this one compacts: it opens the
		// old file and waits for its lock.
		child = crashtest.Start(t, "open", "IDEM_JOURNAL="+path)
		line, ok := child.Next()
		require.True(t, ok)
		pid, ok := strings.CutPrefix(line, "opening ")
		require.True(t, ok, line)
		waitForOpenFile(t, pid, path)
	})
	require.NoError(t, err)
	require.NotNil(t, child, "the journal was not compacted")
	op := newOp("parent-key")
	mustReserve(t, s, op)
	require.NoError(t, s.Close(), "the live journal was not replaced under the first opener")

	lines, err := child.Wait()
	require.NoError(t, err, "%v", lines)
	assert.Equal(t, []string{lines[0], "found pending"}, lines, "the second opener got the live journal, after the first")
	s = openBolt(t, path)
	got, err := s.Get(t.Context(), "parent-key")
	require.NoError(t, err, "the first opener's reservation is in the journal")
	assert.Equal(t, idemstore.StatePending, got.State)
	_, err = s.Named(t.Context(), "pay:pending")
	require.NoError(t, err)
}

func TestSymlinkedJournalIsCompactedInPlace(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "volume"), 0o700))
	target := filepath.Join(dir, "volume", "journal.db")
	keep := mostlyFreeJournal(t, target)
	link := filepath.Join(dir, "journal.db")
	require.NoError(t, os.Symlink(filepath.Join("volume", "journal.db"), link))
	before, err := os.Stat(target)
	require.NoError(t, err)

	s := openBolt(t, link)
	li, err := os.Lstat(link)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSymlink, li.Mode()&os.ModeSymlink, "the journal path is still a symbolic link")
	after, err := os.Stat(target)
	require.NoError(t, err)
	assert.Less(t, after.Size(), before.Size()/4, "the link's target was compacted")
	got, err := s.Named(t.Context(), "pay:pending")
	require.NoError(t, err)
	assert.Equal(t, keep.Body, got.Body)
	mustReserve(t, s, newOp("after"))
	require.NoError(t, s.Close())
	s = openBolt(t, target)
	_, err = s.Get(t.Context(), "after")
	require.NoError(t, err, "what was written through the link is in the target")
	_, err = os.Stat(target + ".compact")
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestCloseReportsAJournalReplacedUnderIt(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "journal.db")
	s, err := boltjournal.Open(path, nil)
	require.NoError(t, err)
	mustReserve(t, s, newOp("a"))
	other, err := boltjournal.Open(filepath.Join(dir, "other.db"), nil)
	require.NoError(t, err)
	require.NoError(t, other.Close())
	require.NoError(t, os.Rename(filepath.Join(dir, "other.db"), path))
	err = s.Close()
	require.ErrorIs(t, err, idemstore.ErrJournalWrite)
	assert.True(t, errors.Is(err, idemstore.ErrJournalWrite) && strings.Contains(err.Error(), "replaced"), "%v", err)
}

func TestBoltStoreCompactsMostlyFreeJournalAtOpen(t *testing.T) {
	// A burst of large requests, all finished: the file keeps their pages
	// (free now) until Open finds it mostly free and compacts it.
	path := filepath.Join(t.TempDir(), "journal.db")
	keep := mostlyFreeJournal(t, path)
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	s := openBolt(t, path)
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if after.Size() > before.Size()/4 {
		t.Fatalf("journal of %d bytes, mostly free, is %d bytes after Open; want it compacted", before.Size(), after.Size())
	}
	t.Logf("compacted at Open: %d -> %d bytes", before.Size(), after.Size())
	if got, err := s.Named(ctx, "pay:pending"); err != nil || !bytes.Equal(got.Body, keep.Body) {
		t.Fatalf("pending operation after compaction: %+v, %v", got, err)
	}
	if got, err := s.Get(ctx, "big-3-07"); err != nil || got.State != idemstore.StateSucceeded {
		t.Fatalf("finished operation after compaction: %+v, %v", got, err)
	}
	mustReserve(t, s, newOp("after-compaction"))
	if _, err := os.Stat(path + ".compact"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("compaction left its temporary file: %v", err)
	}
}

func TestReadersRacingWritersSeeNoOlderCopy(t *testing.T) {
	// A reader's transaction may begin before a writer commits and look
	// at its ID after: that is no file going back.
	s := openBolt(t, filepath.Join(t.TempDir(), "journal.db"))
	ctx := t.Context()
	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := range 4 {
		wg.Go(func() {
			for i := range 300 {
				if _, _, err := s.Reserve(ctx, newOp(fmt.Sprintf("w%d-%03d", w, i))); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var readers sync.WaitGroup
	for range 4 {
		readers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, err := s.Get(ctx, "w0-000"); err != nil && !errors.Is(err, idemstore.ErrNotFound) {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(done)
	readers.Wait()
}
