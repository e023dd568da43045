package idem_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// outcome is what a Resume handler received for one operation.
type outcome struct {
	op     idem.Operation
	status int
	body   string
	err    error
}

// outcomes is the record of a collect handler, safe for concurrent use.
type outcomes struct {
	mu  sync.Mutex
	got []outcome
}

func (o *outcomes) list() []outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]outcome(nil), o.got...)
}

func (o *outcomes) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = nil
}

// collect returns a Resume handler that records every call, and the record.
func collect() (func(idem.Operation, *http.Response, error), *outcomes) {
	rec := &outcomes{}
	return func(op idem.Operation, resp *http.Response, err error) {
		o := outcome{op: op, err: err}
		if resp != nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			o.status, o.body = resp.StatusCode, string(b)
		}
		rec.mu.Lock()
		rec.got = append(rec.got, o)
		rec.mu.Unlock()
	}, rec
}

// leavePending sends one keyed POST whose every attempt fails without a
// response, so the operation stays pending in store, and returns its key.
func leavePending(t *testing.T, c *idem.Client, rt *scriptRT, ctx context.Context, body string) string {
	t.Helper()
	n := len(rt.sent)
	_, err := post(t, ctx, c.HTTPClient(), body)
	require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
	require.Greater(t, len(rt.sent), n)
	return rt.sent[len(rt.sent)-1].key
}

func TestResumeFinishesPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{fail(errReset)}}
		var mu sync.Mutex // the hook runs on Resume's workers, concurrently
		var prepared []string
		c, store := newTestClient(rt, idem.WithMaxAttempts(2), idem.WithResumePrepare(func(r *http.Request) error {
			mu.Lock()
			defer mu.Unlock()
			prepared = append(prepared, r.Header.Get("Idempotency-Key"))
			r.Header.Set("Authorization", "Bearer resumed")
			return nil
		}))
		defer c.Close()
		k1 := leavePending(t, c, rt, context.Background(), `{"order":1}`)
		time.Sleep(time.Second)
		k2 := leavePending(t, c, rt, idem.WithOperation(context.Background(), "pay:order-2"), `{"order":2}`)

		rt.mu.Lock()
		rt.steps = []step{{status: 201, body: "charged"}}
		sentBefore := len(rt.sent)
		rt.mu.Unlock()
		fn, got := collect()
		require.NoError(t, c.Resume(context.Background(), fn))

		require.Len(t, got.list(), 2, "fn is called once per pending operation")
		byKey := map[string]outcome{}
		for _, o := range got.list() {
			byKey[o.op.Key] = o
		}
		for key, body := range map[string]string{k1: `{"order":1}`, k2: `{"order":2}`} {
			o := byKey[key]
			require.NoError(t, o.err)
			assert.Equal(t, 201, o.status)
			assert.Equal(t, "charged", o.body)
			assert.Equal(t, idem.StateSucceeded, o.op.State)
			op, err := store.Get(context.Background(), key)
			require.NoError(t, err)
			assert.Equal(t, idem.StateSucceeded, op.State)
			var resent *sentReq
			for i := sentBefore; i < len(rt.sent); i++ {
				if rt.sent[i].key == key {
					resent = &rt.sent[i]
				}
			}
			require.NotNil(t, resent, "operation %s resent with its original key", key)
			assert.Equal(t, body, resent.body)
			assert.Equal(t, "application/json", resent.header.Get("Content-Type"))
			assert.Equal(t, "Bearer resumed", resent.header.Get("Authorization"))
		}
		assert.Equal(t, "pay:order-2", byKey[k2].op.Name)
		assert.ElementsMatch(t, []string{k1, k2}, prepared)

		got.reset()
		require.NoError(t, c.Resume(context.Background(), fn))
		assert.Empty(t, got.list(), "nothing left to resume")
	})
}

func TestResumeExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{fail(errReset)}}
		c, store := newTestClient(rt, idem.WithMaxAttempts(1), idem.WithResendWindow(time.Hour))
		defer c.Close()
		key := leavePending(t, c, rt, context.Background(), "{}")
		time.Sleep(time.Hour)
		n := len(rt.sent)
		fn, got := collect()
		require.NoError(t, c.Resume(context.Background(), fn))
		require.Len(t, got.list(), 1)
		assert.ErrorIs(t, got.list()[0].err, idem.ErrExpired)
		assert.Equal(t, idem.StateExpired, got.list()[0].op.State)
		assert.Len(t, rt.sent, n, "an expired operation is not sent")
		op, err := store.Get(context.Background(), key)
		require.NoError(t, err)
		assert.Equal(t, idem.StateExpired, op.State)
	})
}

func TestResumeHandlerPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{fail(errReset)}}
		c, store := newTestClient(rt, idem.WithMaxAttempts(1), idem.WithResumeConcurrency(1))
		defer c.Close()
		k1 := leavePending(t, c, rt, context.Background(), `{"n":1}`)
		time.Sleep(time.Second)
		k2 := leavePending(t, c, rt, context.Background(), `{"n":2}`)
		rt.mu.Lock()
		rt.steps = []step{resp(200)}
		rt.mu.Unlock()

		var delivered []string
		err := c.Resume(context.Background(), func(op idem.Operation, resp *http.Response, err error) {
			if op.Key == k1 {
				panic("handler bug")
			}
			resp.Body.Close()
			delivered = append(delivered, op.Key)
		})
		require.Error(t, err)
		assert.Contains(t, err.Error(), k1)
		assert.Equal(t, []string{k2}, delivered, "Resume went on after the panic")
		op, err := store.Get(context.Background(), k1)
		require.NoError(t, err)
		assert.Equal(t, idem.StatePending, op.State, "the panicked operation stays pending")

		fn, got := collect()
		require.NoError(t, c.Resume(context.Background(), fn))
		require.Len(t, got.list(), 1)
		assert.Equal(t, k1, got.list()[0].op.Key)
		assert.Equal(t, `{"n":1}`, rt.sent[len(rt.sent)-1].body)
	})
}

func TestResumeSkipsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var mu sync.Mutex
		var keys []string
		calls := 0
		rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			calls++
			n := calls
			keys = append(keys, r.Header.Get("Idempotency-Key"))
			mu.Unlock()
			if n == 1 {
				<-release
			}
			return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
		})
		c, _ := newTestClient(rt)
		defer c.Close()
		done := make(chan error)
		go func() {
			r, err := post(t, context.Background(), c.HTTPClient(), "{}")
			if err == nil {
				r.Body.Close()
			}
			done <- err
		}()
		synctest.Wait() // the live call is now blocked inside the transport
		fn, got := collect()
		require.NoError(t, c.Resume(context.Background(), fn))
		assert.Empty(t, got.list(), "an operation in flight here is not resumed")
		close(release)
		require.NoError(t, <-done)
		assert.Len(t, keys, 1)
	})
}

func TestResumeBadURL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(200)}}
		c, store := newTestClient(rt)
		defer c.Close()
		_, created, err := store.Reserve(context.Background(), idem.Operation{
			Key: "k-bad-url", Method: "POST", URL: "http://[::1]:namedport/x", State: idem.StatePending, Created: time.Now(),
		})
		require.NoError(t, err)
		require.True(t, created)
		fn, got := collect()
		require.NoError(t, c.Resume(context.Background(), fn))
		require.Len(t, got.list(), 1)
		assert.ErrorIs(t, got.list()[0].err, idem.ErrInvalidRequest)
		assert.Empty(t, rt.sent)
		op, err := store.Get(context.Background(), "k-bad-url")
		require.NoError(t, err)
		assert.Equal(t, idem.StateFailed, op.State)
	})
}

func TestNamedReDrive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(201, "Idempotent-Replayed", "true")}}
		c, _ := newTestClient(rt, idem.WithResendWindow(time.Hour))
		defer c.Close()
		ctx := idem.WithOperation(context.Background(), "refund:r-9")
		for range 2 {
			r, err := post(t, ctx, c.HTTPClient(), `{"refund":9}`)
			require.NoError(t, err)
			r.Body.Close()
		}
		require.Len(t, rt.sent, 2)
		assert.Equal(t, rt.sent[0].key, rt.sent[1].key, "within the window: resent with the same key")

		time.Sleep(time.Hour)
		_, err := post(t, ctx, c.HTTPClient(), `{"refund":9}`)
		require.ErrorIs(t, err, idem.ErrExpired)
		var ie *idem.Error
		require.ErrorAs(t, err, &ie)
		assert.Equal(t, idem.StateSucceeded, ie.State, "carries the recorded outcome")
		assert.Equal(t, 201, ie.LastStatus)
		assert.Equal(t, rt.sent[0].key, ie.Key)
		assert.Len(t, rt.sent, 2, "not sent beyond the window")
	})
}

func TestBackgroundResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{fail(errReset)}}
		fn, got := collect()
		c, store := newTestClient(rt, idem.WithMaxAttempts(1), idem.WithBackgroundResume(time.Minute, fn))
		key := leavePending(t, c, rt, context.Background(), "{}")
		rt.mu.Lock()
		rt.steps = []step{resp(200)}
		rt.mu.Unlock()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		assert.Empty(t, got.list(), "not yet: the operation is younger than the interval")
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		require.Len(t, got.list(), 1)
		assert.Equal(t, key, got.list()[0].op.Key)
		require.NoError(t, c.Close())
		_, err := store.Get(context.Background(), key)
		require.ErrorIs(t, err, idem.ErrClosed)
	})
}

// TestResumeHeaderPrepareError checks that a failing prepare hook leaves
// the operation pending and reports the error.
func TestResumePrepareError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{fail(errReset)}}
		c, store := newTestClient(rt, idem.WithMaxAttempts(1), idem.WithResumePrepare(func(*http.Request) error {
			return io.ErrClosedPipe
		}))
		defer c.Close()
		key := leavePending(t, c, rt, context.Background(), "{}")
		n := len(rt.sent)
		fn, got := collect()
		require.NoError(t, c.Resume(context.Background(), fn))
		require.Len(t, got.list(), 1)
		assert.ErrorIs(t, got.list()[0].err, io.ErrClosedPipe)
		assert.Len(t, rt.sent, n)
		op, err := store.Get(context.Background(), key)
		require.NoError(t, err)
		assert.Equal(t, idem.StatePending, op.State)
		assert.True(t, strings.HasPrefix(op.URL, "https://pay.example/"))
	})
}

// TestSweepWithoutResume checks that a process that never calls Resume
// still forgets finished operations once their retention has passed.
func TestSweepWithoutResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(201)}}
		c, store := newTestClient(rt, idem.WithRetention(30*time.Minute), idem.WithResendWindow(time.Minute))
		defer c.Close()
		r, err := post(t, context.Background(), c.HTTPClient(), `{"n":1}`)
		require.NoError(t, err)
		r.Body.Close()
		old := rt.sent[0].key
		time.Sleep(2 * time.Hour)
		r, err = post(t, context.Background(), c.HTTPClient(), `{"n":2}`)
		require.NoError(t, err)
		r.Body.Close()
		synctest.Wait() // the sweep runs in the background
		_, err = store.Get(context.Background(), old)
		require.ErrorIs(t, err, idem.ErrNotFound, "swept after its retention")
		_, err = store.Get(context.Background(), rt.sent[1].key)
		require.NoError(t, err, "the fresh one stays")
	})
}
