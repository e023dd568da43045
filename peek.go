package idem

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/idemgo/idem/internal/wait"
)

// The one peek at a failed answer's body, which the classifier reads for
// what the server says (a 409's problem type, a provider's error codes):
// at most peekLimit bytes, read within peekWait of the first peek at that
// response. net/http returns at the headers, and a body that stalls must
// not hold the call: RoundTrip never waits for a body longer than
// peekWait, however many readers look at it.
const (
	peekLimit = 4 << 10
	peekWait  = time.Second
)

// peekBody returns the first bytes of resp's body, at most peekLimit, and
// the body that holds them, which replaces resp.Body so that the caller
// still reads the body whole. The first call starts the read in a
// goroutine and waits for it until peekWait has passed, or the request's
// context ends; every later call on the same response shares that read
// and its deadline. It returns a
// nil body when resp has none, or the read stalled past its deadline or
// failed: then the classifier knows nothing from the body.
func peekBody(resp *http.Response) ([]byte, *peekedBody) {
	if resp.Body == nil || resp.Body == http.NoBody {
		return nil, nil
	}
	pb, ok := resp.Body.(*peekedBody)
	if !ok {
		pb = &peekedBody{rc: resp.Body, done: make(chan struct{}), until: time.Now().Add(peekWait)}
		resp.Body = pb
		go pb.peek()
	}
	if pb.stalled() {
		parent := context.Background()
		if resp.Request != nil {
			parent = resp.Request.Context() // a caller who left stops the wait too
		}
		ctx, cancel := context.WithDeadline(parent, pb.until)
		defer cancel()
		if wait.For(ctx, "a response body's first bytes", pb.done) != nil {
			return nil, nil
		}
	}
	if pb.err != nil {
		return nil, nil
	}
	return pb.buf, pb
}

// notKeptStatus returns the original status that readConflict found in
// the body of resp, a 409 it classified as performed, or 0 when the
// server did not say.
func notKeptStatus(resp *http.Response) int {
	if pb, ok := resp.Body.(*peekedBody); ok {
		return pb.original
	}
	return 0
}

// peekedBody is a failed answer's body whose first bytes a goroutine
// reads for peekBody. Reads wait for that goroutine and return its bytes
// first, then the rest of the body; Close closes the body, which also ends
// a peek that stalls.
type peekedBody struct {
	rc    io.ReadCloser
	done  chan struct{} // closed when the peek has ended
	until time.Time     // when peekBody stops waiting for it
	buf   []byte
	err   error
	off   int
	// original is a ProblemNotKept's original_status, or 0.
	original int
}

func (p *peekedBody) peek() {
	defer close(p.done)
	p.buf, p.err = io.ReadAll(io.LimitReader(p.rc, peekLimit))
}

// stalled reports whether the peek is still waiting for the body.
func (p *peekedBody) stalled() bool { return !ready(p.done) }

func (p *peekedBody) Read(b []byte) (int, error) {
	<-p.done
	if p.off < len(p.buf) {
		n := copy(b, p.buf[p.off:])
		p.off += n
		return n, nil
	}
	if p.err != nil {
		return 0, p.err
	}
	return p.rc.Read(b)
}

func (p *peekedBody) Close() error { return p.rc.Close() }
