package pgstore_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storetest"
)

// Tests of who may take a pending operation in a fleet.

// TestSameOwnerNameWaitsForLease opens a second Store as a restarted
// process with the same owner name would (or a second process while the
// first, a zombie, still runs): it takes none of the first one's live
// leases, by Claim or Acquire, and takes them once they lapsed.
func TestSameOwnerNameWaitsForLease(t *testing.T) {
	first := openStore(t)
	second := replica(t, first)
	ctx := testContext(t)
	now := time.Now()
	op := storetest.NewOperation("k1")
	op.Created, op.Updated, op.Owner, op.LeaseUntil = now, now, "bff-1", now.Add(time.Minute)
	_, _, err := first.Reserve(ctx, op)
	require.NoError(t, err)

	l := idem.Lease{Owner: "bff-1", At: now, Until: now.Add(time.Minute)}
	ops, err := second.Claim(ctx, l, "", 0)
	require.NoError(t, err)
	assert.Empty(t, ops, "Claim by the same owner name in another incarnation takes no live lease")
	_, err = second.Acquire(ctx, "k1", l, nil, nil)
	assert.ErrorIs(t, err, idem.ErrInProgress, "nor does Acquire")
	assert.ErrorIs(t, second.Renew(ctx, "k1", l), idem.ErrLeaseLost, "nor Renew")

	require.NoError(t, first.Renew(ctx, "k1", l), "the first incarnation still holds it")
	ops, err = first.Claim(ctx, l, "", 0)
	require.NoError(t, err)
	assert.Len(t, ops, 1, "the holder itself may claim its own")

	later := idem.Lease{Owner: "bff-1", At: now.Add(2 * time.Minute), Until: now.Add(3 * time.Minute)}
	ops, err = second.Claim(ctx, later, "", 0)
	require.NoError(t, err)
	assert.Len(t, ops, 1, "once the lease lapsed, the new incarnation takes it")
	assert.ErrorIs(t, first.Renew(ctx, "k1", l), idem.ErrLeaseLost, "and the old one lost it")
}

// TestSkippedClaimReleased has a background Resume claim an operation it
// finds too recent to send: it releases the lease at once, instead of
// keeping it for a whole lease while nothing sends the operation.
func TestSkippedClaimReleased(t *testing.T) {
	s := openStore(t)
	other := replica(t, s)
	ctx := testContext(t)
	now := time.Now()
	op := storetest.NewOperation("recent")
	op.Created, op.Updated, op.Owner, op.LeaseUntil = now, now.Add(time.Hour), "", time.Time{} // too recent for a long while
	_, _, err := other.Reserve(ctx, op)
	require.NoError(t, err)

	c := idem.New(s, idem.WithOwner("resumer"), idem.WithLease(time.Minute),
		idem.WithBackgroundResume(20*time.Millisecond, func(_ idem.Operation, resp *http.Response, _ error) {
			if resp != nil {
				resp.Body.Close()
			}
		}))
	defer c.Close()
	require.Eventually(t, func() bool {
		rec, err := other.Get(ctx, "recent")
		return err == nil && rec.Owner == "resumer" && !rec.LeaseUntil.After(time.Now())
	}, time.Minute, 20*time.Millisecond, "the skipped operation's lease is released")
	rec, err := other.Get(ctx, "recent")
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, rec.State)
	assert.Zero(t, rec.Attempts, "not sent")
}
