package boltjournal_test

// Tests of what Open checks before it trusts a journal, and of Salvage.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/boltjournal"
	"github.com/idemgo/idem/idemstore"
	bolt "go.etcd.io/bbolt"
)

// pendingJournal writes n pending operations key-000 ... to a journal at
// path, spread over many leaf pages, and closes it.
func pendingJournal(t *testing.T, path string, n int) {
	t.Helper()
	s, err := boltjournal.Open(path, nil)
	require.NoError(t, err)
	for i := range n {
		op := newOp(fmt.Sprintf("key-%03d", i))
		op.Name = fmt.Sprintf("pay:%03d", i)
		op.Body = bytes.Repeat([]byte{'b'}, 200)
		mustReserve(t, s, op)
	}
	require.NoError(t, s.Close())
	compactFile(t, path)
}

// leafOffset returns where in the journal at path the leaf page holding
// key starts, and where key is.
func leafOffset(t *testing.T, path, key string) (page, at int) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	ps := os.Getpagesize()
	for off := 0; ; {
		i := bytes.Index(b[off:], []byte(key))
		require.GreaterOrEqual(t, i, 0, "no leaf page holds %s", key)
		at = off + i
		page = at / ps * ps
		// bbolt's leaf page flag, and the key followed by its record
		// (codec version 2), not a name's value.
		if binary.LittleEndian.Uint16(b[page+8:]) == 0x02 && b[at+len(key)] == 2 {
			return page, at
		}
		off = at + len(key)
	}
}

func TestOpenFindsADamagedPendingRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	pendingJournal(t, path, 300)
	_, at := leafOffset(t, path, "key-150")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	// Flip a byte of the record's body, a little after its key.
	i := at + bytes.Index(b[at:], bytes.Repeat([]byte{'b'}, 200)) + 100
	overwriteAt(t, path, int64(i), []byte{'B'})

	_, err = idem.Open(path)
	require.ErrorIs(t, err, idemstore.ErrJournalCorrupt, "Open refuses a journal with a damaged pending record")
	assert.Contains(t, err.Error(), `record "key-150" is damaged`)
	assert.NotContains(t, err.Error(), "newer")

	s, err := boltjournal.Open(path, &boltjournal.Options{SkipCheck: true})
	require.NoError(t, err)
	defer s.Close()
	ops, err := s.Salvage(t.Context())
	require.ErrorIs(t, err, idemstore.ErrJournalCorrupt)
	require.Len(t, ops, 300, "every record is listed, the damaged one by its key")
	assert.Equal(t, "key-150", ops[150].Key)
	assert.Zero(t, ops[150].State)
	assert.Contains(t, ops[150].LastError, "damaged")
	assert.Equal(t, idemstore.StatePending, ops[151].State)
}

func TestOpenFindsADamagedPage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	pendingJournal(t, path, 300)
	page, _ := leafOffset(t, path, "key-150")
	overwriteAt(t, path, int64(page), bytes.Repeat([]byte{0xA5}, os.Getpagesize()))

	_, err := idem.Open(path)
	require.ErrorIs(t, err, idemstore.ErrJournalCorrupt, "Open finds the damaged page")

	s, err := boltjournal.Open(path, &boltjournal.Options{SkipCheck: true})
	require.NoError(t, err)
	defer s.Close()
	ops, err := s.Salvage(t.Context())
	require.ErrorIs(t, err, idemstore.ErrJournalCorrupt)
	assert.Contains(t, err.Error(), "could not be read")
	assert.NotContains(t, err.Error(), "goroutine", "no panic text")
	got := map[string]bool{}
	for _, op := range ops {
		got[op.Key] = op.State == idemstore.StatePending
	}
	assert.True(t, got["key-000"] && got["key-299"], "records before and after the damaged page are read")
	assert.False(t, got["key-150"], "the damaged page's records are not")
	assert.Greater(t, len(ops), 250, "only one page's records are lost")
	t.Logf("salvaged %d of 300 records: %v", len(ops), err)
	if i := strings.Index(err.Error(), "between"); i >= 0 {
		t.Log(err.Error()[i:])
	}
}

// overwriteAt writes b into the file at path at offset off.
func overwriteAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(b, off)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// compactFile rewrites the bbolt file at path into a fresh one, so that
// every page in it is live: no stale copy of a record in a free page.
func compactFile(t *testing.T, path string) {
	t.Helper()
	src, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	dst, err := bolt.Open(path+".tmp", 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bolt.Compact(dst, src, 0))
	require.NoError(t, dst.Close())
	require.NoError(t, src.Close())
	require.NoError(t, os.Rename(path+".tmp", path))
}

// BenchmarkOpenCheck measures OpenBoltStore (with its check of pending
// records and names) and Close on a journal of 100,000 finished and 1,000
// pending operations, half of them named, against the same open with
// SkipCheck.
func BenchmarkOpenCheck(b *testing.B) {
	path := filepath.Join(b.TempDir(), "journal.db")
	s, err := boltjournal.Open(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	const finished, pending = 100_000, 1_000
	var wg sync.WaitGroup
	next := make(chan int)
	for range 128 {
		wg.Go(func() {
			for i := range next {
				op := newOp(fmt.Sprintf("%08d-%s", i, uuid.NewString()))
				if i%2 == 0 {
					op.Name = fmt.Sprintf("pay:%d", i)
				}
				if i < finished {
					op.State, op.LastStatus, op.Header, op.Body = idemstore.StateSucceeded, 201, nil, nil
				}
				if _, _, err := s.Reserve(context.Background(), op); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for i := range finished + pending {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	fi, _ := os.Stat(path)
	for _, bc := range []struct {
		name string
		skip bool
	}{{"check", false}, {"skip-check", true}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportMetric(float64(fi.Size())/(1<<20), "file-MiB")
			for b.Loop() {
				s, err := boltjournal.Open(path, &boltjournal.Options{SkipCheck: bc.skip})
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestOpenFindsABrokenNameMapping(t *testing.T) {
	for name, put := range map[string][2]string{
		"a pending record's name maps elsewhere": {"pay:001", "key-002"},
		"a name maps to no key":                  {"pay:zzz", "not a key\x00"},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			pendingJournal(t, path, 3)
			db, err := bolt.Open(path, 0o600, nil)
			require.NoError(t, err)
			require.NoError(t, db.Update(func(tx *bolt.Tx) error {
				return tx.Bucket([]byte("names")).Put([]byte(put[0]), []byte(put[1]))
			}))
			require.NoError(t, db.Close())
			_, err = idem.Open(path)
			require.ErrorIs(t, err, idemstore.ErrJournalCorrupt)
			assert.Contains(t, err.Error(), put[0])
		})
	}
}
