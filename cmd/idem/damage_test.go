package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	bolt "go.etcd.io/bbolt"
)

// damagedJournal makes a journal of 300 pending operations key-000 ...
// and overwrites the leaf page that holds key-150 with garbage.
func damagedJournal(t *testing.T) string {
	t.Helper()
	ops := make([]idem.Operation, 300)
	for i := range ops {
		ops[i] = forgedOp(fmt.Sprintf("key-%03d", i), fmt.Sprintf("pay:%03d", i), "https://api.example.com/v1/charges", time.Now())
		ops[i].Body = bytes.Repeat([]byte{'b'}, 200)
	}
	path := forge(t, idem.Policy{}, ops...)
	compactFile(t, path)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	ps := os.Getpagesize()
	for off := 0; ; {
		i := bytes.Index(b[off:], []byte("key-150"))
		require.GreaterOrEqual(t, i, 0)
		page := (off + i) / ps * ps
		// A leaf page of the records: the key is followed by its record,
		// which starts with the codec's version (2).
		if binary.LittleEndian.Uint16(b[page+8:]) == 0x02 && b[off+i+7] == 2 {
			overwrite(t, path, int64(page), bytes.Repeat([]byte{0xA5}, ps))
			return path
		}
		off += i + 7
	}
}

func TestDamagedJournalIsListedAround(t *testing.T) {
	path := damagedJournal(t)
	for _, cmd := range []string{"ls", "pending"} {
		r := runIdem(t, "--journal", path, cmd)
		assert.Equal(t, exitFailed, r.code, cmd)
		assert.Contains(t, r.stdout, "key-000", "%s lists what is readable before the damage", cmd)
		assert.Contains(t, r.stdout, "key-299", "%s lists what is readable after the damage", cmd)
		assert.NotContains(t, r.stdout, "key-150")
		assert.Contains(t, r.stderr, "could not be read", cmd)
		assert.Contains(t, r.stderr, "damaged", cmd)
		assert.NotContains(t, r.stderr, "goroutine ", "%s: no panic text", cmd)

		r = runIdem(t, "--journal", path, "--json", cmd)
		var l listing
		require.NoError(t, jsonUnmarshal(r.stdout, &l), r.stdout)
		assert.Greater(t, len(l.Operations), 250, cmd)
		assert.Contains(t, l.Error, "could not be read", cmd)
	}
	var v opView
	runJSON(t, &v, "--journal", path, "show", "pay:299")
	assert.Equal(t, "key-299", v.Key, "show finds a readable operation by name")
	r := runIdem(t, "--journal", path, "stats")
	assert.Equal(t, exitFailed, r.code)
	assert.Contains(t, r.stdout, "pending")
	assert.NotContains(t, r.stderr, "goroutine ")

	// The application refuses it, and so do the commands that write.
	_, err := idem.Open(path, idem.WithBaseTransport(http.DefaultTransport))
	require.ErrorIs(t, err, idem.ErrJournalCorrupt)
	r = runIdem(t, "--journal", path, "resume")
	assert.Equal(t, exitFailed, r.code)
	assert.Contains(t, r.stderr, "idem ls")
}

func TestDamagedRecordIsNamed(t *testing.T) {
	ops := []idem.Operation{
		forgedOp("k-a", "pay:a", "https://api.example.com/v1/charges", time.Now()),
		forgedOp("k-b", "pay:b", "https://api.example.com/v1/charges", time.Now()),
	}
	path := forge(t, idem.Policy{}, ops...)
	compactFile(t, path)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	i := bytes.LastIndex(b, []byte(`{"amount":4200}`))
	require.Greater(t, i, 0)
	overwrite(t, filepath.Clean(path), int64(i+2), []byte{'X'})
	r := runIdem(t, "--journal", path, "pending")
	assert.Equal(t, exitFailed, r.code)
	assert.Contains(t, r.stdout, "unreadable")
	assert.Contains(t, r.stdout, "damaged")
	assert.NotContains(t, r.stdout, "newer idem", "a checksum failure is damage, not a newer version")
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

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
