package pgstore_test

import (
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

// TestLockedRowSlowsOnlyItsOperation has another connection hold one
// journal row FOR UPDATE (an operator's session, a long transaction) while
// the store marks that operation and others: the other operations' marks
// are written, reservations go on, and the held operation stays pending
// (in doubt, never finished by assumption) until the lock is let go, when
// its mark is written.
func TestLockedRowSlowsOnlyItsOperation(t *testing.T) {
	s := openStore(t)
	other := replica(t, s)
	ctx := testContext(t)
	now := time.Now()
	reserve := func(key string) {
		op := storetest.NewOperation(key)
		op.Created, op.Updated, op.Owner, op.LeaseUntil = now, now, "replica-1", now.Add(time.Hour)
		_, created, err := s.Reserve(ctx, op)
		require.NoError(t, err)
		require.True(t, created)
	}
	reserve("held")
	reserve("free")

	locker, err := pgx.Connect(ctx, pgtest.DSN(t))
	require.NoError(t, err)
	defer locker.Close(ctx)
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{s.Schema(), "operations"}.Sanitize()+` WHERE key = 'held' FOR UPDATE`)
	require.NoError(t, err)

	done := idem.Outcome{State: idem.StateSucceeded, Sent: 1, Status: 201, At: now, Owner: "replica-1"}
	require.NoError(t, s.Finish(ctx, "held", done), "a mark that cannot be written in time is accepted")
	require.NoError(t, s.Finish(ctx, "free", done))
	// A read of the store waits for the marks it accepted before, but
	// not for one that waits for a row lock; the other replica then
	// reads what PostgreSQL holds.
	for _, st := range []*pgstore.Store{s, other} {
		rec, err := st.Get(ctx, "free")
		require.NoError(t, err)
		assert.Equal(t, idem.StateSucceeded, rec.State, "another operation's mark, written while one row is held")
	}

	later := storetest.NewOperation("later")
	later.Created, later.Updated = now, now
	_, created, err := s.Reserve(ctx, later)
	require.NoError(t, err, "a reservation while one row is held")
	assert.True(t, created)

	var rec idem.Operation
	for _, st := range []*pgstore.Store{s, other} {
		rec, err = st.Get(ctx, "held")
		require.NoError(t, err)
		assert.Equal(t, idem.StatePending, rec.State, "the held operation, while its mark waits: in doubt")
	}

	require.NoError(t, tx.Rollback(ctx))
	for ctx.Err() == nil {
		if rec, err = other.Get(ctx, "held"); err == nil && rec.State != idem.StatePending {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	assert.Equal(t, idem.StateSucceeded, rec.State, "the held operation's mark, once the lock is let go")
	assert.NoError(t, s.Close(), "every mark written")
}
