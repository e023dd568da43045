package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestVerifyReportsNoRawPanic: a free list page that is not one makes
// bbolt's page check panic, which bbolt recovers and hands back as an
// error reading "panic: ..."; verify says what that means instead of
// passing the panic's text on.
func TestVerifyReportsNoRawPanic(t *testing.T) {
	j := newJournal(t)
	path := filepath.Join(t.TempDir(), "copy.db")
	b, err := os.ReadFile(j.path)
	require.NoError(t, err)
	ps := int64(binary.LittleEndian.Uint32(b[16+8:]))
	require.NoError(t, os.WriteFile(path, b, 0o600))
	// Each meta page names the free list page (after the page header, the
	// magic, version, page size, flags and the root bucket); turn it into
	// a branch page.
	for _, meta := range []int64{0, ps} {
		freelist := int64(binary.LittleEndian.Uint64(b[meta+16+16+16:]))
		require.Less(t, freelist*ps, int64(len(b)), "free list page %d", freelist)
		overwrite(t, path, freelist*ps+8, []byte{0x01, 0x00})
	}

	r := runIdem(t, "--journal", path, "verify")
	t.Logf("stdout %s\nstderr %s", r.stdout, r.stderr)
	assert.Equal(t, exitFailed, r.code)
	assert.NotContains(t, r.stdout+r.stderr, "panic", "no raw panic text")
	assert.NotContains(t, r.stdout+r.stderr, "goroutine ")
	assert.Contains(t, r.stdout+r.stderr, "damaged")
}
