package idem

import (
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// TestOnePeekOneBound: a provider's classifier and the conflict reader
// share one peek at a stalled 409, so classifying it waits peekWait once,
// not once per reader.
func TestOnePeekOneBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		go pw.Write([]byte(`{"error":{"code":`)) // then nothing more
		// A provider whose codes the body does not carry: both readers peek.
		c := newConfig([]Option{WithProvider(Provider{InProgressCodes: []string{"busy"}})})
		resp := &http.Response{StatusCode: http.StatusConflict, Header: http.Header{}, Body: pr}
		start := time.Now()
		v, reason := c.classify(resp)
		if got := time.Since(start); got != peekWait {
			t.Errorf("classifying a stalled 409 waited %v, want one peekWait (%v)", got, peekWait)
		}
		if v != transient {
			t.Errorf("verdict %v (%s), want transient: a stalled 409 is in progress", v, reason)
		}
		resp.Body.Close()
	})
}
