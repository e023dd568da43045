package idem_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// hangingStore is a journal that stops answering, its contexts ignored,
// once hang is set: a database behind a network that drops every packet.
// Its calls then wait until release is closed. Reservations before hang
// go through.
type hangingStore struct {
	idem.KeyStore
	hang     atomic.Bool
	release  chan struct{}
	finishes atomic.Int32
}

func (s *hangingStore) stall() {
	if s.hang.Load() {
		<-s.release
	}
}

func (s *hangingStore) Attempt(ctx context.Context, key string, a idem.Attempt) error {
	s.stall()
	return s.KeyStore.Attempt(ctx, key, a)
}

func (s *hangingStore) Renew(ctx context.Context, key string, l idem.Lease) error {
	s.stall()
	return s.KeyStore.Renew(ctx, key, l)
}

func (s *hangingStore) Finish(ctx context.Context, key string, o idem.Outcome) error {
	s.finishes.Add(1)
	s.stall()
	return s.KeyStore.Finish(ctx, key, o)
}

// TestInDoubtMarksBoundedByCallersDeadline: a payment whose deadline ends
// while the provider is slow, with the journal stuck, returns within its
// deadline plus the documented grace of 1 s; the operation stays in doubt
// (pending, never finished), and its marks are written once the journal
// answers again.
func TestInDoubtMarksBoundedByCallersDeadline(t *testing.T) {
	const (
		deadline = 2 * time.Second
		grace    = time.Second // the README's in-doubt grace
	)
	synctest.Test(t, func(t *testing.T) {
		mem := idem.NewMemoryStore()
		store := &hangingStore{KeyStore: mem, release: make(chan struct{})}
		slow := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			store.hang.Store(true) // the journal stops answering while the provider is slow
			<-r.Context().Done()
			return nil, context.Cause(r.Context())
		})
		c := idem.New(store, idem.WithBaseTransport(slow), idem.WithMaxAttempts(1))
		defer c.Close()

		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		start := time.Now()
		var (
			took time.Duration
			err  error
		)
		returned := make(chan struct{})
		go func() {
			defer close(returned)
			_, err = post(t, ctx, c.HTTPClient(), `{"amount":1}`)
			took = time.Since(start)
		}()
		time.Sleep(10 * time.Second) // fake time: past the deadline and its grace, within the lease
		synctest.Wait()
		ok := false
		select {
		case <-returned:
			ok = true
		default:
		}
		close(store.release) // the journal answers again
		<-returned
		require.True(t, ok, "the call did not return while the journal was stuck: the in-doubt marks wait without a bound")
		assert.LessOrEqual(t, took, deadline+grace, "returned after its deadline plus the grace")
		var ie *idem.Error
		require.ErrorAs(t, err, &ie)
		assert.Equal(t, idem.StatePending, ie.State, "in doubt")

		synctest.Wait() // the marks, in the background, are written now
		rec, gerr := mem.Get(context.Background(), ie.Key)
		require.NoError(t, gerr)
		assert.Equal(t, idem.StatePending, rec.State, "the operation stays in doubt, never finished by assumption")
		assert.Zero(t, store.finishes.Load(), "nothing finished the operation")
		assert.Equal(t, 1, rec.Attempts, "the attempt mark was written once the journal answered")
		assert.False(t, rec.LeaseUntil.After(rec.Updated), "the lease was released")
	})
}
