package idemserver

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Problem types (RFC 9457 "type" members) of the middleware's own answers.
const (
	// ProblemMissingKey is the type of the 400 answer to a request without
	// a key on a route that requires one, or a webhook without an event id.
	ProblemMissingKey = "https://github.com/idemgo/idem/idemserver#missing-key"
	// ProblemInvalidKey is the type of the 400 answer to a malformed key
	// (see ParseKey) or webhook event id, or to a request with more than
	// one key header.
	ProblemInvalidKey = "https://github.com/idemgo/idem/idemserver#invalid-key"
	// ProblemInProgress is the type of the 409 answer while an earlier
	// request with the same key is being handled; retry after Retry-After.
	ProblemInProgress = "https://github.com/idemgo/idem/idemserver#in-progress"
	// ProblemKeyMismatch is the type of the 422 answer to a key reused with
	// another payload.
	ProblemKeyMismatch = "https://github.com/idemgo/idem/idemserver#key-mismatch"
	// ProblemBodyTooLarge is the type of the 413 answer to a request body
	// over the limit (see WithMaxBodyBytes).
	ProblemBodyTooLarge = "https://github.com/idemgo/idem/idemserver#body-too-large"
	// ProblemUnauthorized is the type of the 401 answer when the principal
	// function returns an error.
	ProblemUnauthorized = "https://github.com/idemgo/idem/idemserver#unauthorized"
	// ProblemUnavailable is the type of the 503 answer when the store
	// cannot be read or written; the handler did not run.
	ProblemUnavailable = "https://github.com/idemgo/idem/idemserver#store-unavailable"
	// ProblemBadRequest is the type of the 400 answer when the request
	// body cannot be read.
	ProblemBadRequest = "https://github.com/idemgo/idem/idemserver#bad-request"
	// ProblemNotStored is the type of the 503 answer when the handler ran
	// but its answer could not be stored (the store failed, or the lease
	// on the key was lost while the handler ran): the handler's answer is
	// withheld, because a retry might get another one. The key stays
	// locked until its lease lapses, unless the request's transaction
	// rolled back for certain (see TxStore): then it is released.
	ProblemNotStored = "https://github.com/idemgo/idem/idemserver#response-not-stored"
	// ProblemTxAborted is the type of the 500 answer when the handler
	// answered with a status that would be stored as a success (below
	// 400) while the request's transaction had been aborted by a failed
	// statement (see ErrTxAborted): a bug in the handler, which dropped a
	// database error. Nothing of the handler's is committed and the key
	// is released.
	ProblemTxAborted = "https://github.com/idemgo/idem/idemserver#transaction-aborted"
	// ProblemNotKept is the type of the 409 answer to a retry of a
	// request that was handled and answered, but whose answer could not
	// be kept (too large, a hijacked connection, a stream cut off). The
	// handler does not run again; the document's original_status member
	// holds the status first sent, when it is known. idem's client does
	// not send the request again and journals it as performed, with that
	// status (succeeded if it was a 2xx or 3xx); other clients read
	// "already-used" in the type as a permanent conflict.
	ProblemNotKept = "https://github.com/idemgo/idem/idemserver#already-used-response-not-kept"
	// ProblemOverloaded is the type of the 503 answer, with Retry-After,
	// to a keyed request that arrives while the bodies and answers of the
	// requests in flight fill WithMaxBufferedBytes; its body was not read
	// and its key is untouched.
	ProblemOverloaded = "https://github.com/idemgo/idem/idemserver#overloaded"
)

// problemDoc is an RFC 9457 problem details document.
// Every document the middleware writes has all four standard members.
type problemDoc struct {
	Type           string `json:"type"`
	Title          string `json:"title"`
	Status         int    `json:"status"`
	Detail         string `json:"detail"`
	OriginalStatus int    `json:"original_status,omitempty"`
}

// writeProblem answers with an application/problem+json document; a
// positive retryAfter sets Retry-After in whole seconds, rounded up.
func writeProblem(w http.ResponseWriter, status int, typ, title, detail string, retryAfter time.Duration) {
	writeDoc(w, problemDoc{Type: typ, Title: title, Status: status, Detail: detail}, retryAfter)
}

// writeDoc answers with the problem document doc.
func writeDoc(w http.ResponseWriter, doc problemDoc, retryAfter time.Duration) {
	status := doc.Status
	body, _ := json.Marshal(doc)
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((retryAfter+time.Second-1)/time.Second), 10))
	}
	w.WriteHeader(status)
	w.Write(body)
}
