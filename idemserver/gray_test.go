package idemserver_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

// stuckSweep wraps a store whose Sweep hangs, its context ignored, until
// release is closed: a database that stopped answering.
type stuckSweep struct {
	idemserver.Store
	entered chan struct{}
	release chan struct{}
}

func (s *stuckSweep) Sweep(ctx context.Context, now time.Time) (int, error) {
	s.entered <- struct{}{}
	<-s.release
	return 0, nil
}

// TestMiddlewareCloseBoundedByStoreTimeout: Close waits for a sweep that
// does not end at most the store timeout, and says what it stopped
// waiting for.
func TestMiddlewareCloseBoundedByStoreTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &stuckSweep{Store: idemserver.NewMemoryStore(), entered: make(chan struct{}, 1), release: make(chan struct{})}
		mw := idemserver.New(st, idemserver.WithSweepInterval(time.Minute), idemserver.WithStoreTimeout(2*time.Second))
		h := mw.Required(&app{})
		time.Sleep(2 * time.Minute)
		do(h, req{key: "k1", body: "a"}) // starts a sweep, which hangs
		<-st.entered
		closed := make(chan error, 1)
		go func() { closed <- mw.Close() }()
		time.Sleep(3 * time.Second) // fake time: past the store timeout
		synctest.Wait()
		returned := false
		var err error
		select {
		case err = <-closed:
			returned = true
		default:
		}
		close(st.release)
		if !returned {
			err = <-closed
		}
		require.True(t, returned, "Close waited for a stuck sweep past the store timeout")
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorContains(t, err, "sweep")
	})
}
