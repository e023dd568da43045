package idem_test

import (
	"context"
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

func TestClockAheadAtOpenSweepsNoNames(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := idem.WithOperation(context.Background(), "pay:order-42")
		rt := &scriptRT{steps: []step{resp(201)}}
		// The payment was made an hour ago by a correct clock.
		mem := idem.NewMemoryStore()
		hourAgo := time.Now().Add(-8*24*time.Hour - time.Hour) // "now" below is 8 days ahead
		mem.SetNow(func() time.Time { return hourAgo })
		store := &anchoredStore{sharedStore: sharedStore{mem}, last: hourAgo}
		c := idem.New(store, idem.WithBaseTransport(rt))
		r, err := post(t, ctx, c.HTTPClient(), `{"amount":1}`)
		require.NoError(t, err)
		r.Body.Close()
		require.NoError(t, c.Close())
		first := rt.sent[0].key
		op, err := mem.Get(context.Background(), first)
		require.NoError(t, err)
		require.Equal(t, idem.StateSucceeded, op.State)

		// The process restarts with its clock eight days ahead: the sweep at
		// open must not take the name's key, so the re-drive keeps it.
		mem.SetNow(time.Now)
		c = idem.New(store, idem.WithBaseTransport(rt))
		defer c.Close()
		synctest.Wait() // the first sweep runs in the background
		_, err = mem.Named(context.Background(), "pay:order-42")
		require.NoError(t, err, "the name survived the sweep")
		r, err = post(t, ctx, c.HTTPClient(), `{"amount":1}`)
		require.NoError(t, err)
		r.Body.Close()
		require.Len(t, rt.sent, 2)
		assert.Equal(t, first, rt.sent[1].key, "the re-drive kept the name's key")
	})
}
