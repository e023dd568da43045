package idem_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/fingerprint"
	"github.com/idemgo/idem/internal/logtest"
)

// heldRT is a base RoundTripper that holds every request until release is
// closed, then answers 201.
type heldRT struct {
	release chan struct{}
	entered atomic.Int64
}

func (h *heldRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.ReadAll(r.Body)
		r.Body.Close()
	}
	h.entered.Add(1)
	select {
	case <-h.release:
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	return &http.Response{StatusCode: 201, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("done")), Request: r}, nil
}

// releaseOnce lets the held requests go, once.
func (h *heldRT) releaseOnce() {
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

// callResult is what one caller got.
type callResult struct {
	key    string
	status int
	body   string
	err    error
}

// startCalls starts n keyed POSTs through c, each reading its answer to the
// end, and returns the channel their results arrive on.
func startCalls(t *testing.T, c *idem.Client, n int) <-chan callResult {
	out := make(chan callResult, n)
	for i := range n {
		go func() {
			req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader(fmt.Sprintf(`{"n":%d}`, i)))
			if err != nil {
				out <- callResult{err: err}
				return
			}
			r, err := c.HTTPClient().Do(req)
			if err != nil {
				out <- callResult{err: err}
				return
			}
			b, err := io.ReadAll(r.Body)
			r.Body.Close()
			out <- callResult{key: r.Request.Header.Get("Idempotency-Key"), status: r.StatusCode, body: string(b), err: err}
		}()
	}
	return out
}

// TestCloseWaitsForCallsInFlight checks that Close lets the calls in flight
// finish and records their outcomes, while refusing new calls.
func TestCloseWaitsForCallsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "journal.db")
		rt := &heldRT{release: make(chan struct{})}
		c, err := idem.Open(path, idem.WithBaseTransport(rt))
		require.NoError(t, err)
		defer rt.releaseOnce()
		results := startCalls(t, c, 5)
		synctest.Wait()
		require.Equal(t, int64(5), rt.entered.Load(), "five calls in flight")

		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		synctest.Wait()
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) with five calls in flight", err)
		default:
		}
		_, err = post(t, context.Background(), c.HTTPClient(), `{"late":true}`)
		require.ErrorIs(t, err, idem.ErrClosed, "a new call during Close")
		assert.Equal(t, int64(5), rt.entered.Load(), "the late call was not sent")

		rt.releaseOnce()
		var keys []string
		for range 5 {
			r := <-results
			require.NoError(t, r.err)
			assert.Equal(t, 201, r.status)
			assert.Equal(t, "done", r.body)
			keys = append(keys, r.key)
		}
		require.NoError(t, <-closed)

		s, err := idem.OpenBoltStore(path, nil)
		require.NoError(t, err)
		defer s.Close()
		assert.Empty(t, pendingOf(t, s), "nothing pending after Close")
		for _, k := range keys {
			op, err := s.Get(context.Background(), k)
			require.NoError(t, err)
			assert.Equal(t, idem.StateSucceeded, op.State, "operation %s", k)
			assert.Equal(t, 1, op.Attempts)
		}
	})
}

// TestShutdownDeadlineKeepsPending checks that a Shutdown whose context
// ends before the calls in flight do returns an error and leaves those
// calls pending in the journal.
func TestShutdownDeadlineKeepsPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "journal.db")
		rt := &heldRT{release: make(chan struct{})}
		c, err := idem.Open(path, idem.WithBaseTransport(rt))
		require.NoError(t, err)
		results := startCalls(t, c, 5)
		synctest.Wait()
		require.Equal(t, int64(5), rt.entered.Load())

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err = c.Shutdown(ctx)
		require.Error(t, err)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "5 calls")

		close(rt.release)
		for range 5 {
			r := <-results
			if r.err == nil {
				assert.Equal(t, 201, r.status)
			}
		}
		s, err := idem.OpenBoltStore(path, nil)
		require.NoError(t, err)
		defer s.Close()
		pend := pendingOf(t, s)
		assert.Len(t, pend, 5, "the unfinished calls stay pending: nothing lost")
		for _, op := range pend {
			assert.NotEmpty(t, op.Body, "with their requests, for Resume")
		}
	})
}

// TestFutureRecord checks that a record dated in the future (the clock
// moved) is neither resumed nor re-driven.
func TestFutureRecord(t *testing.T) {
	const target = "https://pay.example/v1/charges"
	body := []byte(`{"amount":1}`)
	header := http.Header{"Content-Type": {"application/json"}}
	reserveFuture := func(t *testing.T, store idem.KeyStore, key string) {
		t.Helper()
		_, created, err := store.Reserve(context.Background(), idem.Operation{
			Key: key, Method: http.MethodPost, URL: target, Fingerprint: fingerprint.Sum(http.MethodPost, target, header, body),
			State: idem.StatePending, Created: time.Now().Add(48 * time.Hour), Header: header, Body: body,
		})
		require.NoError(t, err)
		require.True(t, created)
	}
	t.Run("resume", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(201)}}
			c, store := newTestClient(rt)
			defer c.Close()
			reserveFuture(t, store, "k-future")
			fn, got := collect()
			require.NoError(t, c.Resume(context.Background(), fn))
			require.Len(t, got.list(), 1)
			assert.ErrorIs(t, got.list()[0].err, idem.ErrExpired)
			assert.Empty(t, rt.sent, "not sent")
		})
	})
	t.Run("re-drive with WithKey", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(201)}}
			c, store := newTestClient(rt)
			defer c.Close()
			reserveFuture(t, store, "k-future")
			_, err := post(t, idem.WithKey(context.Background(), "k-future"), c.HTTPClient(), string(body))
			require.ErrorIs(t, err, idem.ErrExpired)
			assert.Empty(t, rt.sent, "not sent")
			op, err := store.Get(context.Background(), "k-future")
			require.NoError(t, err)
			assert.Equal(t, idem.StatePending, op.State)
		})
	})
}

// TestResumeReportsUnreadableRecords checks that Resume reports a pending
// record it cannot read, says how many there were, and resumes the others.
func TestResumeReportsUnreadableRecords(t *testing.T) {
	tests := []struct {
		name   string
		damage func(v []byte) []byte
		want   error
	}{
		{"newer record version", func([]byte) []byte {
			rec := []byte{0xfe, 1, 2, 3} // ends in the checksum every version ends in
			return binary.LittleEndian.AppendUint32(rec, crc32.Checksum(rec, crc32.MakeTable(crc32.Castagnoli)))
		}, idem.ErrRecordVersion},
		{"truncated record", func(v []byte) []byte { return bytes.Clone(v[:len(v)/2]) }, idem.ErrJournalCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			rt := &scriptRT{steps: []step{fail(errReset)}}
			c, err := idem.Open(path, idem.WithBaseTransport(rt), idem.WithMaxAttempts(1))
			require.NoError(t, err)
			var keys []string
			for i := range 3 {
				_, err := post(t, context.Background(), c.HTTPClient(), fmt.Sprintf(`{"n":%d}`, i))
				require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
				keys = append(keys, rt.sent[len(rt.sent)-1].key)
			}
			require.NoError(t, c.Close())

			damaged := keys[1]
			db, err := bolt.Open(path, 0o600, nil)
			require.NoError(t, err)
			err = db.Update(func(tx *bolt.Tx) error {
				b := tx.Bucket(idem.BucketOps)
				return b.Put([]byte(damaged), tt.damage(b.Get([]byte(damaged))))
			})
			require.NoError(t, db.Close())
			require.NoError(t, err)

			rt2 := &scriptRT{steps: []step{resp(201)}}
			c, err = idem.Open(path, idem.WithBaseTransport(rt2))
			if tt.want == idem.ErrJournalCorrupt {
				// Open finds the damage before it trusts the journal; a
				// tool that opens it anyway (SkipCheck) meets it in Resume.
				require.ErrorIs(t, err, idem.ErrJournalCorrupt)
				assert.Contains(t, err.Error(), damaged)
				assert.Contains(t, err.Error(), "damaged")
				store, err := idem.OpenBoltStore(path, &idem.BoltOptions{SkipCheck: true})
				require.NoError(t, err)
				c = idem.New(store, idem.WithBaseTransport(rt2))
			} else {
				require.NoError(t, err, "a record of a newer idem is no damage")
			}
			defer c.Close()
			fn, got := collect()
			err = c.Resume(context.Background(), fn)
			require.Error(t, err, "Resume says that records could not be read")
			assert.ErrorIs(t, err, tt.want)
			assert.Contains(t, err.Error(), "1 pending operation")

			byKey := map[string]outcome{}
			for _, o := range got.list() {
				byKey[o.op.Key] = o
			}
			require.Len(t, byKey, 3, "fn is called for each pending operation, readable or not")
			var ie *idem.Error
			require.ErrorAs(t, byKey[damaged].err, &ie)
			assert.Equal(t, damaged, ie.Key)
			assert.ErrorIs(t, ie, tt.want)
			for _, k := range []string{keys[0], keys[2]} {
				require.NoError(t, byKey[k].err)
				assert.Equal(t, 201, byKey[k].status, "the readable ones are resumed")
			}
			assert.Len(t, rt2.sent, 2)
		})
	}
}

// TestResumeWaitHonoursContext checks that a Resume waiting for another
// Resume gives up when its context ends.
func TestResumeWaitHonoursContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{fail(errReset)}}
		hold, entered := make(chan struct{}), make(chan struct{}, 1)
		c, _ := newTestClient(rt, idem.WithMaxAttempts(1), idem.WithResumePrepare(func(*http.Request) error {
			entered <- struct{}{}
			<-hold
			return nil
		}))
		defer c.Close()
		leavePending(t, c, rt, context.Background(), "{}")
		first := make(chan error, 1)
		go func() {
			first <- c.Resume(context.Background(), func(_ idem.Operation, r *http.Response, _ error) { closeResp(r) })
		}()
		<-entered

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		called := false
		err := c.Resume(ctx, func(_ idem.Operation, r *http.Response, _ error) { called = true; closeResp(r) })
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.False(t, called)
		close(hold)
		require.NoError(t, <-first)
	})
}

func closeResp(r *http.Response) {
	if r != nil {
		r.Body.Close()
	}
}

// TestSecretsInURLNotJournaled checks that the URL's user info and secret
// query parameters never reach the journal file, and that a finished
// record keeps no query at all.
func TestSecretsInURLNotJournaled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			password = "pw-Zq81xLm"
			apiKey   = "SECRET-Kx93rT"
		)
		path := filepath.Join(t.TempDir(), "journal.db")
		rt := &scriptRT{steps: []step{fail(errReset)}}
		c, err := idem.Open(path, idem.WithBaseTransport(rt), idem.WithMaxAttempts(1),
			idem.WithResumePrepare(func(r *http.Request) error {
				r.URL.User = nil
				r.SetBasicAuth("alice", password)
				q := r.URL.Query()
				q.Set("api_key", apiKey)
				r.URL.RawQuery = q.Encode()
				return nil
			}))
		require.NoError(t, err)
		defer c.Close()
		req, err := http.NewRequest(http.MethodPost, "https://alice:"+password+"@pay.example/x?api_key="+apiKey+"&order=42", strings.NewReader("{}"))
		require.NoError(t, err)
		_, err = c.HTTPClient().Do(req)
		require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
		require.Len(t, rt.sent, 1)
		key := rt.sent[0].key

		// The Client is still open: the record is pending.
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		require.True(t, bytes.Contains(raw, []byte(key)), "the pending record is in the file")
		require.True(t, bytes.Contains(raw, []byte("order=42")), "the harmless query is kept while pending")
		basic := base64.StdEncoding.EncodeToString([]byte("alice:" + password))
		for _, secret := range []string{password, apiKey, basic} {
			assert.False(t, bytes.Contains(raw, []byte(secret)), "the journal file holds %q", secret)
		}

		rt.mu.Lock()
		rt.steps = []step{resp(201)}
		rt.mu.Unlock()
		fn, got := collect()
		require.NoError(t, c.Resume(context.Background(), fn))
		require.Len(t, got.list(), 1)
		require.NoError(t, got.list()[0].err)
		assert.Contains(t, rt.sent[1].url, "api_key="+apiKey, "the hook put the secret back for the resend")

		ops := finishedRecord(t, c, path, key)
		assert.Equal(t, idem.StateSucceeded, ops.State)
		assert.NotContains(t, ops.URL, "?", "a finished record keeps no query")
		assert.NotContains(t, ops.URL, "order=42")
	})
}

// finishedRecord closes c and returns the record for key from the journal
// at path.
func finishedRecord(t *testing.T, c *idem.Client, path, key string) idem.Operation {
	t.Helper()
	require.NoError(t, c.Close())
	s, err := idem.OpenBoltStore(path, nil)
	require.NoError(t, err)
	defer s.Close()
	op, err := s.Get(context.Background(), key)
	require.NoError(t, err)
	return op
}

// idleCounter is a base RoundTripper that counts CloseIdleConnections.
type idleCounter struct {
	scriptRT
	closes atomic.Int64
}

func (i *idleCounter) CloseIdleConnections() { i.closes.Add(1) }

// TestClientOptionsAndEdges checks options that compose, the zero
// Transport, CloseIdleConnections and the in-doubt log record.
func TestClientOptionsAndEdges(t *testing.T) {
	t.Run("WithRetryPolicy keeps an earlier WithMaxAttempts", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(503)}}
			c, _ := newTestClient(rt, idem.WithMaxAttempts(2), idem.WithRetryPolicy(idem.RetryPolicy{Initial: time.Second, NoJitter: true}))
			defer c.Close()
			r, err := post(t, context.Background(), c.HTTPClient(), "{}")
			require.NoError(t, err)
			r.Body.Close()
			assert.Len(t, rt.sent, 2)
		})
	})
	t.Run("zero Transport refuses", func(t *testing.T) {
		var hits atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
		defer srv.Close()
		for _, method := range []string{http.MethodPost, http.MethodGet} {
			body := &closeCounter{Reader: strings.NewReader("{}")}
			req, err := http.NewRequest(method, srv.URL+"/x", body)
			require.NoError(t, err)
			var zero idem.Transport
			r, err := zero.RoundTrip(req)
			require.Error(t, err, method)
			assert.Nil(t, r)
			assert.Positive(t, body.closed(), "%s: the body is closed", method)
		}
		assert.Zero(t, hits.Load(), "nothing sent")
	})
	t.Run("CloseIdleConnections reaches the base", func(t *testing.T) {
		base := &idleCounter{}
		c := idem.New(idem.NewMemoryStore(), idem.WithBaseTransport(base))
		defer c.Close()
		c.HTTPClient().CloseIdleConnections()
		assert.Equal(t, int64(1), base.closes.Load())
	})
	t.Run("in doubt is logged at Warn with the key", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			logs := &logtest.Records{}
			rt := &scriptRT{steps: []step{fail(errReset)}}
			c, _ := newTestClient(rt, idem.WithMaxAttempts(1), idem.WithLogger(slog.New(logs)))
			defer c.Close()
			key := leavePending(t, c, rt, context.Background(), "{}")
			found := false
			for _, r := range logs.Find("idem: operation left in doubt") {
				if r.Level == slog.LevelWarn && r.Attrs["idem.key"].String() == key {
					found = true
				}
			}
			assert.True(t, found, "a Warn record with idem.key=%s among %d records", key, logs.Len())
		})
	})
}

// TestShutdownWithResumeRunning checks that Shutdown honours its context
// while a Resume is running, and that a Resume after Close is refused
// rather than left waiting for a Resume slot that Close keeps forever.
func TestShutdownWithResumeRunning(t *testing.T) {
	t.Run("Shutdown deadline while Resume runs", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{fail(errReset)}}
			hold, entered := make(chan struct{}), make(chan struct{}, 1)
			c, _ := newTestClient(rt, idem.WithMaxAttempts(1), idem.WithResumePrepare(func(*http.Request) error {
				entered <- struct{}{}
				<-hold
				return nil
			}))
			leavePending(t, c, rt, context.Background(), "{}")
			resumed := make(chan error, 1)
			go func() {
				resumed <- c.Resume(context.Background(), func(_ idem.Operation, r *http.Response, _ error) { closeResp(r) })
			}()
			<-entered

			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			shut := make(chan error, 1)
			go func() { shut <- c.Shutdown(ctx) }()
			time.Sleep(2 * time.Second) // fake time: the deadline has passed
			synctest.Wait()
			var (
				err      error
				returned bool
			)
			select {
			case err = <-shut:
				returned = true
			default:
			}
			close(hold) // let the Resume go before asserting, so no goroutine is left blocked
			<-resumed
			if !returned {
				err = <-shut
			}
			assert.True(t, returned, "Shutdown did not return when its context ended: it waits for the running Resume without a bound")
			assert.Error(t, err, "Shutdown closed the journal under a running Resume: it must say so")
			assert.ErrorIs(t, err, context.DeadlineExceeded)
		})
	})
	t.Run("Resume after Close", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(201)}}
			c, _ := newTestClient(rt)
			require.NoError(t, c.Close())
			done := make(chan error, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { done <- c.Resume(ctx, func(_ idem.Operation, r *http.Response, _ error) { closeResp(r) }) }()
			time.Sleep(time.Minute) // fake time
			synctest.Wait()
			select {
			case err := <-done:
				assert.ErrorIs(t, err, idem.ErrClosed)
			default:
				t.Error("Resume after Close blocks until its context ends instead of returning ErrClosed")
				cancel()
				<-done
			}
		})
	})
}

// TestClientPendingAndSecretQueryParams: Client.Pending lists what is in
// doubt without its request, and a query parameter named secret stays out
// of the journal (a resend then needs the prepare hook).
func TestClientPendingAndSecretQueryParams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{fail(errReset)}}
		c, store := newTestClient(rt, idem.WithMaxAttempts(1), idem.WithSecretQueryParams("session"))
		defer c.Close()
		req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges?session=S3CR3T&order=7", strings.NewReader(`{"n":1}`))
		require.NoError(t, err)
		_, err = c.HTTPClient().Do(req)
		require.Error(t, err)
		require.Len(t, rt.sent, 1)

		ops, err := c.Pending(context.Background(), "", 0)
		require.NoError(t, err)
		require.Len(t, ops, 1)
		assert.Equal(t, rt.sent[0].key, ops[0].Key)
		assert.Nil(t, ops[0].Body, "Client.Pending hands out no request")
		assert.Nil(t, ops[0].Header)

		rec, err := store.Get(context.Background(), ops[0].Key)
		require.NoError(t, err)
		assert.NotContains(t, rec.URL, "S3CR3T", "a named secret query parameter is not journaled")
		assert.Contains(t, rec.URL, "order=7")
		assert.True(t, rec.Redacted)
		assert.NotEmpty(t, rec.Body, "the store keeps the request")
	})
}
