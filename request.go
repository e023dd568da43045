package idem

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// checkRequest returns why req can never be sent, or nil: no URL, a scheme
// other than http or https, no host, a method that is not a token, a
// header that cannot be written, or a Host that cannot. Such a request is
// refused before anything is journaled.
func checkRequest(req *http.Request) error {
	switch {
	case req.URL == nil:
		return fmt.Errorf("%w: no URL", ErrInvalidRequest)
	case req.URL.Scheme != "http" && req.URL.Scheme != "https":
		return fmt.Errorf("%w: unsupported scheme %s", ErrInvalidRequest, quote(req.URL.Scheme))
	case req.URL.Host == "":
		return fmt.Errorf("%w: no host in URL", ErrInvalidRequest)
	case !validMethod(req.Method):
		return fmt.Errorf("%w: method %s", ErrInvalidRequest, quote(req.Method))
	}
	for k, vs := range req.Header {
		if !validHeaderName(k) {
			return fmt.Errorf("%w: header name %s", ErrInvalidRequest, quote(k))
		}
		for _, v := range vs {
			if i := badValueByte(v); i >= 0 {
				return fmt.Errorf("%w: header %s has a control byte 0x%02x in its value", ErrInvalidRequest, quote(k), v[i])
			}
		}
	}
	if i := badValueByte(req.Host); i >= 0 || strings.Contains(req.Host, " ") {
		return fmt.Errorf("%w: Host %s", ErrInvalidRequest, quote(req.Host))
	}
	return nil
}

// badValueByte returns the index of the first byte of a header value that
// net/http refuses to send (a control byte other than HTAB, or DEL, as
// golang.org/x/net/http/httpguts.ValidHeaderFieldValue), or -1.
func badValueByte(v string) int {
	for i := 0; i < len(v); i++ {
		if b := v[i]; b < ' ' && b != '\t' || b == 0x7f {
			return i
		}
	}
	return -1
}

// lengthMismatch is a request body whose length is not its ContentLength:
// such a request can never be sent as it is.
type lengthMismatch struct{ got, want int64 }

func lengthError(got, want int64) error { return &lengthMismatch{got, want} }

func (e *lengthMismatch) Error() string {
	if e.got < e.want {
		return fmt.Sprintf("body is %d bytes, shorter than its ContentLength %d", e.got, e.want)
	}
	return fmt.Sprintf("body is longer than its ContentLength %d", e.want)
}

// invalidIf returns ErrInvalidRequest if err says the request can never
// be sent, else nil.
func invalidIf(err error) error {
	var lm *lengthMismatch
	if errors.As(err, &lm) || errors.Is(err, errNoBody) {
		return ErrInvalidRequest
	}
	return nil
}

// errNoBody is a GetBody that returned neither a body nor an error.
var errNoBody = errors.New("GetBody returned a nil body and no error")

// validMethod reports whether m is an HTTP token ("" means GET).
func validMethod(m string) bool { return m == "" || validHeaderName(m) }

// validHeaderName reports whether s is an HTTP token (RFC 9110 §5.6.2).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// headerKey returns the key a caller put on the request's header, in any
// spelling of the header's name.
func headerKey(h http.Header, name string) string {
	if vs := h[name]; len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range h {
		if len(vs) > 0 && strings.EqualFold(k, name) {
			return vs[0]
		}
	}
	return ""
}

// outgoingHeader returns a copy of h with value (the key, in a slice the
// caller owns) as the only value of the key header, whatever spelling the
// caller used.
func outgoingHeader(h http.Header, name string, value []string) http.Header {
	out := make(http.Header, len(h)+1)
	for k, v := range h {
		if k != name && strings.EqualFold(k, name) {
			continue
		}
		out[k] = v
	}
	out[name] = value
	return out
}

// withoutHeader returns a copy of h without the header name, in any
// spelling.
func withoutHeader(h http.Header, name string) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		if !strings.EqualFold(k, name) {
			out[k] = v
		}
	}
	return out
}

// readBody reads a request body of at most limit bytes and closes it. If
// the body is larger, it returns the bytes read so far and the unread rest
// (still open).
func readBody(req *http.Request, limit int64) (body []byte, rest io.ReadCloser, err error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil, nil
	}
	if req.ContentLength > limit {
		return nil, req.Body, nil
	}
	if req.ContentLength > 0 {
		// The length is known: read into one buffer of that size and one
		// byte more, which must stay unread (a byte of its own would cost
		// an allocation: it escapes into Read).
		size := req.ContentLength
		body = make([]byte, size+1)
		n, err := io.ReadFull(req.Body, body)
		switch {
		case int64(n) == size: // whatever the read after the end said
			err = nil
		case int64(n) > size:
			err = lengthError(size+1, size)
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			err = lengthError(int64(n), size)
		}
		if err != nil {
			req.Body.Close()
			return nil, nil, err
		}
		return body[:size:size], nil, req.Body.Close()
	}
	body, err = readAtMost(req.Body, limit+1)
	if err != nil {
		req.Body.Close()
		return nil, nil, err
	}
	if int64(len(body)) > limit {
		return body, req.Body, nil
	}
	return body, nil, req.Body.Close()
}
