package pgstore_test

import (
	"cmp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/storetest"
)

// TestReserveHistoryEveryQueryMode reserves a record that has a history
// (as a copy from another store does) in each of pgx's query modes the
// package supports, and reads it back. In exec and simple_protocol (the
// modes a pooler in transaction mode needs) the history went as bytea,
// which PostgreSQL refused as jsonb (22P02).
func TestReserveHistoryEveryQueryMode(t *testing.T) {
	for _, mode := range queryModes {
		t.Run("mode="+cmp.Or(mode, "default"), func(t *testing.T) {
			s, _, _ := onePoolMode(t, mode)
			ctx := testContext(t)
			op := storetest.NewOperation("with-history")
			op.History = []idemstore.Attempt{{Sent: 1, Status: 503, Err: "unavailable", At: op.Created, Owner: op.Owner}}
			_, created, err := s.Reserve(ctx, op)
			require.NoError(t, err)
			assert.True(t, created)
			got, err := s.Get(ctx, op.Key)
			require.NoError(t, err)
			require.Len(t, got.History, 1)
			h := got.History[0]
			assert.Equal(t, [3]any{1, 503, "unavailable"}, [3]any{h.Sent, h.Status, h.Err})
			assert.True(t, h.At.Equal(op.Created), "at %v", h.At)
		})
	}
}
