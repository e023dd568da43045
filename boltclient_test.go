package idem_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// The tests of the bbolt journal itself are in package boltjournal; these
// put it under a Client.

func openBolt(t *testing.T, path string) *idem.BoltStore {
	t.Helper()
	s, err := idem.OpenBoltStore(path, &idem.BoltOptions{LockTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestJournalOverwrittenInPlaceIsDetected(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := idem.OpenBoltStore(path, nil)
	require.NoError(t, err)
	ctx := t.Context()
	mustReserve(t, s, newOp("a"))
	backup, err := os.ReadFile(path)
	require.NoError(t, err)
	mustReserve(t, s, newOp("b"))
	mustReserve(t, s, newOp("c"))

	// An operator restores the backup over the open file, in place.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(backup, 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	_, err = s.Pending(ctx, "", 0)
	require.ErrorIs(t, err, idem.ErrJournalCorrupt, "the in-doubt records b and c vanished: that is an error")
	assert.Contains(t, err.Error(), "older copy")
	rt := &scriptRT{steps: []step{resp(201)}}
	c := idem.New(s, idem.WithBaseTransport(rt))
	_, err = post(t, context.Background(), c.HTTPClient(), `{"amount":1}`)
	require.ErrorIs(t, err, idem.ErrJournalCorrupt)
	assert.Empty(t, rt.sent, "nothing sent")
	require.Error(t, c.Close(), "Close reports the journal replaced under it")
}
