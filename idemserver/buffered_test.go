package idemserver_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

// countingBody is a request body of n bytes that records whether it was
// read.
type countingBody struct {
	io.Reader
	read atomic.Bool
}

func (b *countingBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.Reader.Read(p)
}

func (*countingBody) Close() error { return nil }

// TestBufferedBytesAreBounded is finding 3 of issue 35: keyed requests in
// flight with large bodies reserve their body and response limits; once
// the bound is full, new keyed requests get 503 with Retry-After before
// their body is read, and the reservations come back when the requests
// are answered.
func TestBufferedBytesAreBounded(t *testing.T) {
	const (
		body     = 1 << 20
		response = 64 << 10
		room     = 4
		perReq   = body + response
	)
	s := idemserver.NewMemoryStore()
	defer s.Close()
	entered, release := make(chan struct{}), make(chan struct{})
	a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
		io.Copy(io.Discard, r.Body)
		if strings.HasPrefix(r.Header.Get("Idempotency-Key"), "big-") {
			entered <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}}
	mw := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithMaxBodyBytes(body),
		idemserver.WithMaxResponseBytes(response), idemserver.WithMaxBufferedBytes(room*perReq),
		idemserver.WithRetryAfter(3e9))
	defer mw.Close()
	h := mw.Required(a)
	send := func(key string, length int64) (*httptest.ResponseRecorder, *countingBody) {
		b := &countingBody{Reader: strings.NewReader(strings.Repeat("x", body))}
		r := httptest.NewRequest(http.MethodPost, "/upload", nil)
		r.Body, r.ContentLength = b, length
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w, b
	}

	var wg sync.WaitGroup
	codes := make([]int, room)
	for i := range room {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, _ := send(fmt.Sprintf("big-%d", i), body)
			codes[i] = w.Code
		}()
	}
	for range room {
		<-entered
	}
	assert.EqualValues(t, room*perReq, idemserver.Buffered(mw))

	for i := range 2 * room {
		length := int64(body)
		if i%2 == 1 {
			length = -1 // unknown length reserves the limit
		}
		w, b := send(fmt.Sprintf("late-%d", i), length)
		assert.Equal(t, http.StatusServiceUnavailable, w.Code)
		assert.Equal(t, idemserver.ProblemOverloaded, problemType(t, w))
		assert.Equal(t, "3", w.Header().Get("Retry-After"))
		assert.False(t, b.read.Load(), "a refused request's body was read")
	}
	assert.EqualValues(t, room*perReq, idemserver.Buffered(mw))

	close(release)
	wg.Wait()
	for i, c := range codes {
		assert.Equal(t, http.StatusCreated, c, "request %d", i)
	}
	assert.Zero(t, idemserver.Buffered(mw), "reservations are given back")
	assert.EqualValues(t, room, a.runs.Load())

	// The refused keys were left untouched: each is a first request now.
	w, _ := send("late-0", body)
	assert.Equal(t, http.StatusCreated, w.Code)
	assert.Empty(t, w.Header().Get(idemserver.ReplayedHeader))
	require.Zero(t, idemserver.Buffered(mw))
}
