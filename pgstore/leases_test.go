package pgstore_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
	"github.com/idemgo/idem/storetest"
)

// Tests of who may take a pending operation in a fleet.

// TestSameOwnerNameWaitsForLease opens a second Store as a restarted
// process with the same owner name would (or a second process while the
// first, a zombie, still runs): it takes none of the first one's live
// leases, by Claim or Acquire, and takes them once they lapsed.
func TestSameOwnerNameWaitsForLease(t *testing.T) {
	// The test moves time: the database's clock is the leases' At.
	first := openClocked(t, pgtest.Schema(t, pgtest.DSN(t)))
	ctx := testContext(t)
	second := openClocked(t, first.Schema())
	defer second.Close()
	var err error
	now := time.Now()
	op := storetest.NewOperation("k1")
	op.Created, op.Updated, op.Owner, op.LeaseUntil = now, now, "bff-1", now.Add(time.Minute)
	_, _, err = first.Reserve(ctx, op)
	require.NoError(t, err)

	l := idem.Lease{Owner: "bff-1", At: now, Until: now.Add(time.Minute)}
	ops, err := second.Claim(ctx, l, "", 0)
	require.NoError(t, err)
	assert.Empty(t, ops, "Claim by the same owner name in another incarnation takes no live lease")
	_, err = second.Acquire(ctx, "k1", l, idem.Request{})
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

// TestLeasesByDatabaseClock runs replicas whose times are 30 s off (as a
// Client's would be with its clock off and its offset to the database's
// clock wrong, skewedStore): one 30 s ahead takes no live lease, renewed or
// not; one 30 s behind takes a dead replica's operation as soon as its
// lease lapsed. Leases are judged by the database's clock.
func TestLeasesByDatabaseClock(t *testing.T) {
	a := openStore(t)
	ctx := testContext(t)
	open := func(skew time.Duration) *skewedStore {
		s, err := pgstore.Open(ctx, pgtest.DSN(t), pgstore.WithSchema(a.Schema()))
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return &skewedStore{Store: s, d: skew}
	}
	ahead, behind := open(30*time.Second), open(-30*time.Second)
	now := time.Now()
	live := storetest.NewOperation("live")
	live.Created, live.Updated, live.Owner, live.LeaseUntil = now, now, "a", now.Add(20*time.Second)
	_, _, err := a.Reserve(ctx, live)
	require.NoError(t, err)

	l := func(owner string) idem.Lease {
		now := time.Now()
		return idem.Lease{Owner: owner, At: now, Until: now.Add(20 * time.Second)}
	}
	ops, err := ahead.Claim(ctx, l("ahead"), "", 0)
	require.NoError(t, err)
	assert.Empty(t, ops, "a replica 30 s ahead takes no live lease by Claim")
	_, err = ahead.Acquire(ctx, "live", l("ahead"), idem.Request{})
	assert.ErrorIs(t, err, idem.ErrInProgress, "nor by Acquire")
	require.NoError(t, a.Renew(ctx, "live", l("a")))
	ops, err = ahead.Claim(ctx, l("ahead"), "", 0)
	require.NoError(t, err)
	assert.Empty(t, ops, "nor once renewed")

	dead := storetest.NewOperation("dead")
	dead.Created, dead.Updated, dead.Owner, dead.LeaseUntil = now, now, "gone", now.Add(time.Millisecond)
	_, _, err = a.Reserve(ctx, dead)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ops, err := behind.Claim(ctx, l("behind"), "", 0)
		return err == nil && len(ops) == 1 && ops[0].Key == "dead"
	}, 10*time.Second, 10*time.Millisecond, "a replica 30 s behind takes a lapsed lease at once")
}

// TestNewerFormatLeftAlone puts a pending record of a newer format in the
// journal, as a newer replica would in a rolling deploy: this version's
// Claim never leases it and reports it once; Pending lists it as
// unreadable.
func TestNewerFormatLeftAlone(t *testing.T) {
	var logs logBuffer
	s := openStore(t, pgstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx := testContext(t)
	op := storetest.NewOperation("newer")
	op.Owner, op.LeaseUntil = "", time.Time{}
	_, _, err := s.Reserve(ctx, op)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `UPDATE `+pgx.Identifier{s.Schema(), "operations"}.Sanitize()+` SET version = 99`)
	require.NoError(t, err)

	for range 2 {
		now := time.Now()
		ops, err := s.Claim(ctx, idem.Lease{Owner: "old", At: now, Until: now.Add(time.Minute)}, "", 0)
		require.NoError(t, err)
		assert.Empty(t, ops, "a newer record is not claimed")
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "newer record format"), "reported once: %s", logs.String())
	ops, err := s.Pending(ctx, "", 0)
	assert.ErrorIs(t, err, idem.ErrRecordVersion)
	require.Len(t, ops, 1)
	var owner string
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT owner FROM `+pgx.Identifier{s.Schema(), "operations"}.Sanitize()).Scan(&owner))
	assert.Empty(t, owner, "never leased")
}

// logBuffer is a bytes.Buffer safe for the logger's goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestReleaseOwner has a restarted process take its dead predecessor's
// operations at once, the application having said it is dead.
func TestReleaseOwner(t *testing.T) {
	dead := openStore(t)
	restarted := replica(t, dead)
	ctx := testContext(t)
	now := time.Now()
	op := storetest.NewOperation("k1")
	op.Created, op.Updated, op.Owner, op.LeaseUntil = now, now, "bff-1", now.Add(time.Hour)
	_, _, err := dead.Reserve(ctx, op)
	require.NoError(t, err)
	l := idem.Lease{Owner: "bff-1", At: now, Until: now.Add(time.Minute)}
	ops, err := restarted.Claim(ctx, l, "", 0)
	require.NoError(t, err)
	require.Empty(t, ops, "a live lease of another incarnation")

	n, err := restarted.ReleaseOwner(ctx, "bff-1")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	ops, err = restarted.Claim(ctx, l, "", 0)
	require.NoError(t, err)
	assert.Len(t, ops, 1, "taken at once once released")
	n, err = restarted.ReleaseOwner(ctx, "bff-1")
	require.NoError(t, err)
	assert.Zero(t, n, "its own incarnation's leases stay")
}
