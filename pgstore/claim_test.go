package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// TestServerStoreClaimNotOrphaned drops the client in the middle of a
// claim: PostgreSQL commits the claimed row, its answer is lost (the
// proxy swallows it), and the request's context ends. The claim must not
// leave a key that nobody holds: the next request with the key, on
// another replica, acquires it instead of meeting 409 until the lease
// lapses.
func TestServerStoreClaimNotOrphaned(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	p, viaProxy := newProxy(t, dsn)
	s := openServerStore(t, viaProxy, schema)
	other := openServerStore(t, dsn, schema)
	ctx := testContext(t)
	const id = "claim-dropped-7f3a"
	keys := pgx.Identifier{schema, "inbound_keys"}.Sanitize()

	// The request's context ends once the claim is committed.
	rctx, drop := context.WithCancel(ctx)
	go func() {
		defer drop()
		for ctx.Err() == nil {
			var n int
			if err := other.Pool().QueryRow(ctx, `SELECT count(*) FROM `+keys+` WHERE id = $1`, id).Scan(&n); err == nil && n == 1 {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	p.SwallowAfter(id)
	now := time.Now()
	_, err := s.Begin(rctx, idemserver.Begin{ID: id, Fingerprint: "f", Now: now, LeaseUntil: now.Add(time.Hour)})
	require.Error(t, err, "a claim whose answer was lost and whose request ended")
	t.Logf("dropped claim: %v", err)

	now = time.Now()
	c, err := other.Begin(ctx, idemserver.Begin{ID: id, Fingerprint: "f", Now: now, LeaseUntil: now.Add(time.Hour)})
	require.NoError(t, err)
	assert.Equal(t, idemserver.StateAcquired, c.State, "the retry after a dropped claim (StateInFlight: the key is orphaned until its lease lapses)")
}
