package idemserver_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/internal/crashtest"
)

func init() { crashChildren["migrate"] = childMigrate }

// childMigrate opens the store at IDEM_STORE, announcing the start and
// the end of the Open (which converts a format 2 file), then closes it.
func childMigrate() int {
	crashtest.Emit("opening")
	s, err := idemserver.OpenBoltStore(os.Getenv("IDEM_STORE"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	crashtest.Emit("open")
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// TestBoltMigrationCrash kills a child process (SIGKILL) at points spread
// over its Open of a format 2 file, whose conversion is two transactions,
// and a little past its end: whatever the moment, the next Open finds
// every record once, in the current format, and replays each.
func TestBoltMigrationCrash(t *testing.T) {
	const n = 5000
	dir := t.TempDir()
	orig := filepath.Join(dir, "v2.db")
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("key-%05d", i)
	}
	writeFormat2(t, orig, ids, "", "")
	data, err := os.ReadFile(orig)
	require.NoError(t, err)

	// A first child converts a copy to the end: how long its Open takes
	// places the kills of the next ones.
	path := filepath.Join(dir, "calibrate.db")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	c := crashtest.Start(t, "migrate", "IDEM_STORE="+path)
	line, ok := c.Next()
	require.True(t, ok && line == "opening", "child: %q", line)
	began := time.Now()
	line, ok = c.Next()
	require.True(t, ok && line == "open", "child: %q", line)
	took := time.Since(began)
	_, err = c.Wait()
	require.NoError(t, err)
	checkMigrated(t, path, ids)

	const rounds = 6
	formats := map[string]int{}
	for r := range rounds {
		path := filepath.Join(dir, fmt.Sprintf("round%d.db", r))
		require.NoError(t, os.WriteFile(path, data, 0o600))
		c := crashtest.Start(t, "migrate", "IDEM_STORE="+path)
		line, ok := c.Next()
		require.True(t, ok && line == "opening", "child: %q", line)
		// From the start of the Open to a little past its end.
		time.Sleep(took * time.Duration(r) / (rounds - 2))
		c.Kill()
		formats[fileFormat(t, path)]++
		checkMigrated(t, path, ids)
	}
	t.Logf("Open takes %v; the kills left %v", took, formats)
}

// fileFormat returns the format marker of the store file at path.
func fileFormat(t *testing.T, path string) string {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	require.NoError(t, err)
	defer db.Close()
	var f string
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		if m := tx.Bucket([]byte("meta")); m != nil {
			f = string(m.Get([]byte("format")))
		}
		return nil
	}))
	return f
}

// checkMigrated opens the store at path and checks that it replays
// every one of ids (written by writeFormat2), then that the file is in
// the current format with one record per id.
func checkMigrated(t *testing.T, path string, ids []string) {
	t.Helper()
	s, err := idemserver.OpenBoltStore(path, nil)
	require.NoError(t, err)
	ctx := context.Background()
	now := t0.Add(-time.Second) // every record is live
	for _, id := range ids {
		c, err := s.Begin(ctx, idemserver.Begin{ID: id, Fingerprint: "fp", Now: now, LeaseUntil: now.Add(time.Minute)})
		require.NoError(t, err, id)
		require.Equal(t, idemserver.StateDone, c.State, id)
		require.Equal(t, "body of "+id, string(c.Response.Body))
	}
	require.NoError(t, s.Close())

	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		assert.Equal(t, "idemserver-bolt-4", string(tx.Bucket([]byte("meta")).Get([]byte("format"))))
		assert.Nil(t, tx.Bucket([]byte("keys")))
		assert.Nil(t, tx.Bucket([]byte("expiry")))
		seen := map[string]int{}
		err := tx.Bucket([]byte("records")).ForEach(func(k, _ []byte) error {
			seen[string(k[8:])]++
			return nil
		})
		assert.Len(t, seen, len(ids))
		for id, n := range seen {
			if n != 1 || !strings.HasPrefix(id, "key-") {
				t.Errorf("record %q: %d copies", id, n)
			}
		}
		return err
	}))
}
