package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// TestUnsendableRequests checks that a request that can never be sent is
// refused with a clear error before anything is journaled or sent, and
// that its body is closed.
func TestUnsendableRequests(t *testing.T) {
	mustURL := func(s string) *url.URL {
		u, err := url.Parse(s)
		require.NoError(t, err)
		return u
	}
	tests := []struct {
		name string
		req  func(body io.ReadCloser) *http.Request
		want error
	}{
		{"ftp scheme", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("ftp://pay.example/x"), Header: http.Header{}, Body: b}
		}, idem.ErrInvalidRequest},
		{"unix scheme", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("unix:///var/run/pay.sock"), Header: http.Header{}, Body: b}
		}, idem.ErrInvalidRequest},
		{"no host", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("http:///v1/charges"), Header: http.Header{}, Body: b}
		}, idem.ErrInvalidRequest},
		{"header value with CR LF", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("https://pay.example/x"), Header: http.Header{"X-Note": {"a\r\nX-Injected: 1"}}, Body: b}
		}, idem.ErrInvalidRequest},
		{"header value with LF", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("https://pay.example/x"), Header: http.Header{"X-Note": {"a\nb"}}, Body: b}
		}, idem.ErrInvalidRequest},
		{"header value with a control byte", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("https://pay.example/x"), Header: http.Header{"X-Note": {"a\x01b"}}, Body: b}
		}, idem.ErrInvalidRequest},
		{"header value with ESC", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("https://pay.example/x"), Header: http.Header{"X-Note": {"\x1b[31mred"}}, Body: b}
		}, idem.ErrInvalidRequest},
		{"header value with DEL", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("https://pay.example/x"), Header: http.Header{"X-Note": {"a\x7f"}}, Body: b}
		}, idem.ErrInvalidRequest},
		{"header name with a space", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("https://pay.example/x"), Header: http.Header{"X Note": {"v"}}, Body: b}
		}, idem.ErrInvalidRequest},
		{"Host with a control byte", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("https://pay.example/x"), Host: "a\x01b", Header: http.Header{}, Body: b}
		}, idem.ErrInvalidRequest},
		{"header name with a colon", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("https://pay.example/x"), Header: http.Header{"X-A:b": {"v"}}, Body: b}
		}, idem.ErrInvalidRequest},
		{"Host with CR LF", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("https://pay.example/x"), Host: "a\r\nb", Header: http.Header{}, Body: b}
		}, idem.ErrInvalidRequest},
		{"nil URL", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", Header: http.Header{}, Body: b}
		}, idem.ErrInvalidRequest},
		{"invalid method", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "PO ST", URL: mustURL("https://pay.example/x"), Header: http.Header{}, Body: b}
		}, idem.ErrInvalidRequest},
		{"method with a line break", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST\r\n", URL: mustURL("https://pay.example/x"), Header: http.Header{}, Body: b}
		}, idem.ErrInvalidRequest},
		{"nil Header and a large body", func(b io.ReadCloser) *http.Request {
			return &http.Request{Method: "POST", URL: mustURL("https://pay.example/x"), Body: b, ContentLength: 64}
		}, idem.ErrBodyTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: []step{resp(201)}}
				c, store := newTestClient(rt, idem.WithMaxBodyBytes(16))
				defer c.Close()
				body := &closeCounter{Reader: strings.NewReader(strings.Repeat("b", 64))}
				req := tt.req(body).WithContext(idem.WithKey(context.Background(), "k-unsendable"))
				r, err := c.Transport().RoundTrip(req)
				require.Error(t, err)
				assert.Nil(t, r)
				assert.ErrorIs(t, err, tt.want, "error: %v", err)
				assert.Empty(t, rt.sent, "nothing sent")
				assert.Empty(t, pendingOf(t, store), "nothing pending")
				_, err = store.Get(context.Background(), "k-unsendable")
				assert.ErrorIs(t, err, idem.ErrNotFound, "no record")
				assert.Positive(t, body.closed(), "the body is closed, as a RoundTripper must")
			})
		})
	}
}

// TestUnstorableOperationName: a name every store can keep is valid
// UTF-8 without NUL bytes (PostgreSQL's text refuses the others). Such a
// name is refused before anything is journaled or sent, the same way on
// every store, not accepted by one journal and reported by another as a
// failed write, as if the database were unreachable.
func TestUnstorableOperationName(t *testing.T) {
	for _, name := range []string{"pay:\xff", "pay:\x00", "pay:caf\xe9"} {
		t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(201)}}
			c, store := newTestClient(rt)
			defer c.Close()
			req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), name),
				http.MethodPost, "https://pay.example/x", strings.NewReader(`{}`))
			require.NoError(t, err)
			r, err := c.Transport().RoundTrip(req)
			if r != nil {
				r.Body.Close()
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, idem.ErrInvalidKey, "error: %v", err)
			assert.Empty(t, rt.sent, "nothing sent")
			assert.Empty(t, pendingOf(t, store), "nothing pending")
			assert.Zero(t, store.Len(), "nothing journaled")
		})
	}
}

// fuzzBase is the base RoundTripper of FuzzRoundTrip: it counts the
// requests that reach it and checks, for keyed ones, that the key is valid
// and already journaled.
type fuzzBase struct {
	store *idem.MemoryStore
	mu    sync.Mutex
	n     int
	errs  []error
}

func (b *fuzzBase) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	report := func(format string, args ...any) { b.errs = append(b.errs, fmt.Errorf(format, args...)) }
	if r.URL == nil || (r.URL.Scheme != "http" && r.URL.Scheme != "https") || r.URL.Host == "" {
		report("request with URL %v reached the base", r.URL)
	}
	if r.Method == http.MethodPost || r.Method == http.MethodPatch {
		var keys []string
		for k, vs := range r.Header {
			if strings.EqualFold(k, "Idempotency-Key") {
				keys = append(keys, vs...)
			}
		}
		switch {
		case len(keys) != 1:
			report("%s sent with key header values %q", r.Method, keys)
		case !validKeyText(keys[0]):
			report("%s sent with invalid key %q", r.Method, keys[0])
		default:
			op, err := b.store.Get(context.Background(), keys[0])
			switch {
			case err != nil:
				report("%s sent with key %q that is not journaled: %v", r.Method, keys[0], err)
			case op.State != idem.StatePending:
				report("%s sent with key %q in state %s", r.Method, keys[0], op.State)
			case !op.Unreplayable && !bytes.Equal(op.Body, body):
				report("%s sent body %q, journaled %q", r.Method, body, op.Body)
			}
		}
	}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
}

// validKeyText reports whether k is 1 to 255 bytes of visible ASCII.
func validKeyText(k string) bool {
	if k == "" || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// FuzzRoundTrip sends random requests through a Client: it must never
// panic, and every keyed request that reaches the network must carry one
// valid key that was journaled before it was sent.
func FuzzRoundTrip(f *testing.F) {
	f.Add("POST", "https://pay.example/v1/charges", "Content-Type", "application/json", []byte(`{"a":1}`))
	f.Add("PATCH", "http://127.0.0.1:8080/x?api_key=s&b=2", "idempotency-key", "k-1", []byte("x"))
	f.Add("POST", "https://user:pass@pay.example/", "Idempotency-Key", "has space", []byte(""))
	f.Add("GET", "ftp://pay.example/", "X-A", "b\r\nc", []byte("zz"))
	f.Add("POST", "http:///nohost", "Authorization", "Bearer x", []byte(strings.Repeat("b", 40)))
	f.Add("post", "http://[::1]:namedport", "", "", []byte(nil))
	f.Add("PO ST", "%zz", "IDEMPOTENCY-KEY", "", []byte("q"))
	f.Fuzz(func(t *testing.T, method, rawURL, hname, hval string, body []byte) {
		store := idem.NewMemoryStore()
		base := &fuzzBase{store: store}
		c := idem.New(store, idem.WithBaseTransport(base), idem.WithMaxAttempts(1), idem.WithMaxBodyBytes(32), idem.WithResendMatchWindow(0))
		defer c.Close()
		u, err := url.Parse(rawURL)
		if err != nil {
			u = nil
		}
		req := &http.Request{
			Method: method, URL: u, Header: http.Header{hname: {hval}},
			Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
			GetBody: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil },
		}
		if u != nil {
			req.Host = u.Host
		}
		r, err := c.Transport().RoundTrip(req)
		if err == nil {
			io.ReadAll(r.Body)
			r.Body.Close()
		} else if r != nil {
			t.Errorf("RoundTrip returned a response and an error %v", err)
		}
		base.mu.Lock()
		defer base.mu.Unlock()
		if err != nil && base.n == 0 && !errors.Is(err, idem.ErrInvalidRequest) && !errors.Is(err, idem.ErrInvalidKey) &&
			!errors.Is(err, idem.ErrBodyTooLarge) && !errors.Is(err, idem.ErrKeyReused) {
			t.Errorf("refused with an unclassified error: %v", err)
		}
		for _, e := range base.errs {
			t.Error(e)
		}
	})
}
