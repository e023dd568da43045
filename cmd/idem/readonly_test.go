package main

import (
	"crypto/sha256"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// fileSum returns the SHA-256 of the file at path and its modification
// time.
func fileSum(t *testing.T, path string) ([32]byte, time.Time) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return sha256.Sum256(b), fi.ModTime()
}

// TestReadCommandsWriteNothing is finding 7 of issue 35: verify, ls,
// pending, show and stats leave the journal's bytes as they were, sound
// or damaged; a journal whose ops bucket was deleted (its names still
// pointing at pending keys), or whose names point at records that are
// gone, is damage, exit 1, and the file is not repaired behind the
// operator's back.
func TestReadCommandsWriteNothing(t *testing.T) {
	reads := func(j *journal) [][]string {
		return [][]string{{"verify"}, {"ls"}, {"pending"}, {"show", "pay:lost"}, {"stats"}}
	}
	t.Run("sound", func(t *testing.T) {
		j := newJournal(t)
		before, mtime := fileSum(t, j.path)
		for _, args := range reads(j) {
			r := runIdem(t, append([]string{"--journal", j.path}, args...)...)
			assert.Equal(t, exitOK, r.code, "%v: %s", args, r.stderr)
		}
		after, mtime2 := fileSum(t, j.path)
		assert.Equal(t, before, after, "a read command wrote to the journal")
		assert.Equal(t, mtime, mtime2)
	})
	for name, damage := range map[string]func(tx *bolt.Tx, j *journal) error{
		"ops bucket deleted": func(tx *bolt.Tx, _ *journal) error { return tx.DeleteBucket([]byte("ops")) },
		"named records gone": func(tx *bolt.Tx, j *journal) error {
			for _, n := range []string{"pay:lost", "pay:secret"} {
				if err := tx.Bucket([]byte("ops")).Delete([]byte(j.keys[n])); err != nil {
					return err
				}
			}
			return nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			j := newJournal(t)
			db, err := bolt.Open(j.path, 0o600, nil)
			require.NoError(t, err)
			require.NoError(t, db.Update(func(tx *bolt.Tx) error { return damage(tx, j) }))
			require.NoError(t, db.Close())
			before, _ := fileSum(t, j.path)

			r := runIdem(t, "--journal", j.path, "verify")
			assert.Equal(t, exitFailed, r.code, "verify: %s%s", r.stdout, r.stderr)
			assert.Contains(t, r.stdout, "damage: ")
			if name == "ops bucket deleted" {
				assert.Contains(t, r.stdout, "no ops bucket")
				for _, args := range reads(j)[1:] {
					r := runIdem(t, append([]string{"--journal", j.path}, args...)...)
					assert.Equal(t, exitFailed, r.code, "%v on a journal without its ops bucket: %s", args, r.stdout)
				}
			} else {
				assert.Contains(t, r.stdout, "has no record")
			}
			after, _ := fileSum(t, j.path)
			assert.Equal(t, before, after, "a read command wrote to the damaged journal")
			db, err = bolt.Open(j.path, 0o600, &bolt.Options{ReadOnly: true})
			require.NoError(t, err)
			defer db.Close()
			require.NoError(t, db.View(func(tx *bolt.Tx) error {
				if name == "ops bucket deleted" {
					assert.Nil(t, tx.Bucket([]byte("ops")), "the ops bucket was re-created")
				}
				return nil
			}))
		})
	}
}
