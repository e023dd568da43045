package idem_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// sharedStore is a MemoryStore two Clients share, as replicas share a
// journal, or one Client after another, as a restarted process reopens
// its journal; a Client's Close leaves it open.
type sharedStore struct{ *idem.MemoryStore }

func (sharedStore) Close() error { return nil }

func TestLiveCallRenewsItsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := sharedStore{idem.NewMemoryStore()}
		release := make(chan struct{})
		var sends atomic.Int32
		slow := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if sends.Add(1) == 1 {
				<-release // the provider takes two minutes
			}
			return &http.Response{StatusCode: 201, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
		})
		a := idem.New(store, idem.WithBaseTransport(slow), idem.WithOwner("replica-a"), idem.WithLease(30*time.Second))
		defer a.Close()
		b := idem.New(store, idem.WithBaseTransport(slow), idem.WithOwner("replica-b"), idem.WithLease(30*time.Second))
		defer b.Close()

		done := make(chan error)
		go func() {
			r, err := post(t, idem.WithOperation(context.Background(), "pay:1"), a.HTTPClient(), `{}`)
			if err == nil {
				r.Body.Close()
			}
			done <- err
		}()
		synctest.Wait()
		time.Sleep(2 * time.Minute) // four leases: only renewal keeps it
		fn, got := collect()
		require.NoError(t, b.Resume(context.Background(), fn))
		assert.Empty(t, got.list(), "replica b resumed an operation under replica a's live lease")
		assert.Equal(t, int32(1), sends.Load())
		close(release)
		require.NoError(t, <-done)

		// Once a's call settled, nothing is left to resume.
		require.NoError(t, b.Resume(context.Background(), fn))
		assert.Empty(t, got.list())
	})
}
