package idem

import (
	"bytes"
	"io"
	"net/http"

	"github.com/idemgo/idem/internal/readall"
)

// Bodies as the Transport handles them: a keyed request's body read once
// (at most the journal's limit) and sent again from memory on every
// attempt, a request's own GetBody for one too large to journal, and a
// retried response's body drained so that its connection is reused.

// someBody returns getBody, made to return an error instead of a nil body.
func someBody(getBody func() (io.ReadCloser, error)) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) {
		b, err := getBody()
		if err == nil && b == nil {
			return nil, errNoBody
		}
		return b, err
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// readAtMost reads r to its end or to n bytes, whichever comes first, as
// io.ReadAll(io.LimitReader(r, n)) does without the LimitedReader.
func readAtMost(r io.Reader, n int64) ([]byte, error) {
	return readall.Append(make([]byte, 0, min(n, 512)), r, n)
}

// closeBody closes a request's body, as a RoundTripper must even on errors.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// discard drains a little of a response body, so that the connection can
// be reused, and closes it.
func discard(resp *http.Response) {
	if pb, ok := resp.Body.(*peekedBody); !ok || !pb.stalled() {
		io.CopyN(io.Discard, resp.Body, 4<<10)
	}
	resp.Body.Close()
}

// bodyFunc returns a GetBody over body. Its readers are what net/http
// knows to be in memory (a *bytes.Reader behind io.NopCloser), so that it
// writes a small request's header and body in one write instead of
// flushing the header first.
func bodyFunc(body []byte) func() (io.ReadCloser, error) {
	if len(body) == 0 {
		return func() (io.ReadCloser, error) { return http.NoBody, nil }
	}
	return func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(body)), nil
	}
}
