package idem

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
)

// notKeptURI is idemserver's ProblemNotKept, written out: idemserver's
// TestClientRecordsNotKeptAsPerformed checks the client against the
// constant itself.
const notKeptURI = "https://github.com/idemgo/idem/idemserver#already-used-response-not-kept"

// TestClassifyNotKept: a 409 problem saying the request was performed and
// its answer not kept is classified performed, with its original_status
// when it has one, and its body stays whole for the caller; one that
// stalls is still "in progress" (the stall guard), and the other 409s keep
// their meaning.
func TestClassifyNotKept(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		want     verdict
		original int
	}{
		{"with original_status", `{"type":"` + notKeptURI + `","title":"t","status":409,"detail":"d","original_status":201}`, performed, 201},
		{"without original_status", `{"type":"` + notKeptURI + `","title":"t","status":409,"detail":"d"}`, performed, 0},
		{"nonsense original_status", `{"type":"` + notKeptURI + `","original_status":-3}`, performed, 0},
		{"other server's fragment", `{"type":"https://example.com/p#already-used-response-not-kept"}`, performed, 0},
		{"key already used", `{"type":"https://example.com/p#already-used"}`, permanent, 0},
		{"in progress", `{"type":"https://github.com/idemgo/idem/idemserver#in-progress"}`, transient, 0},
		{"bare", ``, transient, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: http.StatusConflict, Header: http.Header{},
				Body: io.NopCloser(strings.NewReader(tt.body))}
			v, reason := classifyResponse(resp)
			if v != tt.want {
				t.Fatalf("verdict %d (%s), want %d", v, reason, tt.want)
			}
			if v == performed {
				if got := notKeptStatus(resp); got != tt.original {
					t.Errorf("original status %d, want %d", got, tt.original)
				}
			}
			b, err := io.ReadAll(resp.Body)
			if err != nil || string(b) != tt.body {
				t.Errorf("body %q, %v; want %q", b, err, tt.body)
			}
		})
	}
	t.Run("stalled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := NewStalledBody()
			body := io.MultiReader(strings.NewReader(`{"type":"`+notKeptURI+`","original_status":201`), s)
			resp := &http.Response{StatusCode: http.StatusConflict, Header: http.Header{},
				Body: struct {
					io.Reader
					io.Closer
				}{body, s}}
			if v, reason := classifyResponse(resp); v != transient {
				t.Errorf("verdict %d (%s), want transient: a stalled body is in progress", v, reason)
			}
			if got := notKeptStatus(resp); got != 0 {
				t.Errorf("original status %d of a stalled body", got)
			}
			resp.Body.Close()
		})
	})
}

// TestNotKeptOutcome: what the journal records for a request performed
// without its answer kept.
func TestNotKeptOutcome(t *testing.T) {
	tests := []struct {
		original, status int
		state            State
		text             string
		resource         string
	}{
		{201, 201, StateSucceeded, "performed by server, answer not kept (original status 201)", ""},
		{200, 200, StateSucceeded, "performed by server, answer not kept (original status 200)", ""},
		{402, 402, StateFailed, "performed by server, answer not kept (original status 402)", ""},
		{303, 303, StateSucceeded, "performed by server, answer not kept (original status 303)", ""}, // success, as classifyResponse reads a 3xx
		{500, 500, StateFailed, "performed by server, answer not kept (original status 500)", ""},
		{0, 409, StateFailed, "performed by server, answer not kept (status unknown)", ""},
		{0, 409, StateSucceeded, "performed by server, answer not kept (conflicting resource PM1)", "PM1"}, // GoCardless: it was created
		{402, 402, StateFailed, "performed by server, answer not kept (original status 402, conflicting resource PM1)", "PM1"},
	}
	for _, tt := range tests {
		state, status, text := notKeptOutcome(tt.original, tt.resource)
		if state != tt.state || status != tt.status || text != tt.text {
			t.Errorf("notKeptOutcome(%d, %q) = %s, %d, %q; want %s, %d, %q", tt.original, tt.resource, state, status, text, tt.state, tt.status, tt.text)
		}
	}
}
