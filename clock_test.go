package idem_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// anchoredStore is a sharedStore that says when it last changed.
type anchoredStore struct {
	sharedStore
	last time.Time
}

func (s *anchoredStore) LastChange(context.Context) (time.Time, error) { return s.last, nil }

// clockedStore is an anchoredStore with a clock of its own, fixed at at.
type clockedStore struct {
	*anchoredStore
	at time.Time
}

func (s clockedStore) Now(context.Context) (time.Time, error) { return s.at, nil }

func TestClockAheadAtOpenSweepsNoNames(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := idem.WithOperation(context.Background(), "pay:order-42")
		rt := &scriptRT{steps: []step{resp(201)}}
		// The payment was made an hour ago by a correct clock.
		mem := idem.NewMemoryStore()
		hourAgo := time.Now().Add(-8*24*time.Hour - time.Hour) // "now" below is 8 days ahead
		store := &anchoredStore{sharedStore: sharedStore{mem}, last: hourAgo}
		c := idem.New(clockedStore{store, hourAgo}, idem.WithBaseTransport(rt))
		r, err := post(t, ctx, c.HTTPClient(), `{"amount":1}`)
		require.NoError(t, err)
		r.Body.Close()
		require.NoError(t, c.Close())
		first := rt.sent[0].key
		op, err := mem.Get(context.Background(), first)
		require.NoError(t, err)
		require.Equal(t, idem.StateSucceeded, op.State)

		// The process restarts with its clock eight days ahead: the sweep at
		// open must not take the name's key, so the re-drive finds it. By
		// this clock the payment is past the resend window, so the re-drive
		// is refused with its key (a clock ahead may expire early, never
		// resend late); what it must not get is a new key.
		c = idem.New(store, idem.WithBaseTransport(rt))
		defer c.Close()
		synctest.Wait() // the first sweep runs in the background
		_, err = mem.Named(context.Background(), "pay:order-42")
		require.NoError(t, err, "the name survived the sweep")
		_, err = post(t, ctx, c.HTTPClient(), `{"amount":1}`)
		require.ErrorIs(t, err, idem.ErrExpired)
		var ie *idem.Error
		require.ErrorAs(t, err, &ie)
		assert.Equal(t, first, ie.Key, "the re-drive kept the name's key")
		assert.Len(t, rt.sent, 1, "nothing sent past the window")
	})
}

// skewedStore is a shared store whose clock runs an hour ahead of this
// process's, and counts how often it is read.
type skewedStore struct {
	sharedStore
	reads atomic.Int32
}

func (s *skewedStore) Now(context.Context) (time.Time, error) {
	s.reads.Add(1)
	return time.Now().Add(time.Hour), nil
}

func TestJournalTimesFollowTheStoresClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &skewedStore{sharedStore: sharedStore{idem.NewMemoryStore()}}
		rt := &scriptRT{steps: []step{resp(201)}}
		c := idem.New(store, idem.WithBaseTransport(rt))
		defer c.Close()
		require.Equal(t, int32(1), store.reads.Load(), "the offset is measured at New")
		r, err := post(t, context.Background(), c.HTTPClient(), `{"amount":1}`)
		require.NoError(t, err)
		r.Body.Close()
		op, err := store.Get(context.Background(), rt.sent[0].key)
		require.NoError(t, err)
		want := time.Now().Add(time.Hour)
		assert.WithinDuration(t, want, op.Created, time.Second, "Created is on the store's clock")
		assert.WithinDuration(t, want, op.Updated, time.Second, "Updated is on the store's clock")

		// Minutes later the offset is measured again, in the background.
		time.Sleep(6 * time.Minute)
		r, err = post(t, context.Background(), c.HTTPClient(), `{"amount":2}`)
		require.NoError(t, err)
		r.Body.Close()
		synctest.Wait()
		assert.Equal(t, int32(2), store.reads.Load(), "the offset is refreshed")
	})
}
