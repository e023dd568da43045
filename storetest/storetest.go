// Package storetest checks a KeyStore against the contract documented on
// idemstore.KeyStore, as testing/fstest.TestFS does for file systems. The
// memory store, the bbolt journal and the PostgreSQL store pass it; a
// store of your own should too:
//
//	func TestMyStore(t *testing.T) {
//		storetest.Run(t, storetest.Config{
//			Open: func(t *testing.T) idemstore.KeyStore { return openMyStore(t) },
//		})
//	}
package storetest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/idemstore"
)

// Config says how to get stores under test.
type Config struct {
	// Open returns a new, empty store. The suite closes it; Open may also
	// register its own cleanup.
	Open func(t *testing.T) idemstore.KeyStore
	// Reopen, if set, returns a store over the same journal as closed,
	// which the suite has closed: what the first store accepted must be
	// there. Leave it nil for a store without durability.
	Reopen func(t *testing.T, closed idemstore.KeyStore) idemstore.KeyStore
}

// Run runs the contract tests, each as a subtest with a store of
// its own.
func Run(t *testing.T, c Config) {
	if c.Open == nil {
		t.Fatal("storetest: Config.Open is nil")
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runCase(t, t, c, tc.run) })
	}
}

// T is what the contract tests use of a *testing.T, so that the suite can
// also run under a recorder that proves it fails broken stores.
type T interface {
	Helper()
	Context() context.Context
	Error(args ...any)
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skip(args ...any)
}

// runCase runs one contract test with its own store: tt is the test that
// opens the store (Config.Open's argument), t the one that judges it.
func runCase(tt *testing.T, t T, c Config, run func(T, *harness)) {
	h := &harness{Config: c, s: c.Open(tt), tt: tt}
	defer func() { _ = h.s.Close() }()
	run(t, h)
}

type harness struct {
	Config
	s  idemstore.KeyStore
	tt *testing.T // for Reopen
}

// base is the creation time of the operations the tests reserve.
var base = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// NewOperation returns a pending operation with key, a request and a
// fingerprint derived from key, as a transport would reserve it.
func NewOperation(key string) idemstore.Operation {
	return idemstore.Operation{
		Key: key, Method: http.MethodPost, URL: "https://api.example.com/v1/charges?ref=" + key,
		Fingerprint: [32]byte{1, byte(len(key)), key[len(key)-1]},
		State:       idemstore.StatePending,
		Created:     base,
		Updated:     base,
		Owner:       "owner-a",
		LeaseUntil:  base.Add(time.Hour),
		Header:      http.Header{"Content-Type": {"application/json"}, "X-Trace": {"a", "b"}},
		Body:        []byte(`{"amount":42,"key":"` + key + `"}`),
	}
}

func lease(owner string, at time.Time, d time.Duration) idemstore.Lease {
	return idemstore.Lease{Owner: owner, At: at, Until: at.Add(d)}
}

// same fails t unless got has want's fields; times compare by instant.
func same(t T, what string, got, want idemstore.Operation) {
	t.Helper()
	var diffs []string
	check := func(field string, ok bool, g, w any) {
		if !ok {
			diffs = append(diffs, fmt.Sprintf("%s = %v, want %v", field, g, w))
		}
	}
	check("Key", got.Key == want.Key, got.Key, want.Key)
	check("Name", got.Name == want.Name, got.Name, want.Name)
	check("Method", got.Method == want.Method, got.Method, want.Method)
	check("URL", got.URL == want.URL, got.URL, want.URL)
	check("Host", got.Host == want.Host, got.Host, want.Host)
	check("Fingerprint", got.Fingerprint == want.Fingerprint, got.Fingerprint, want.Fingerprint)
	check("State", got.State == want.State, got.State, want.State)
	check("Attempts", got.Attempts == want.Attempts, got.Attempts, want.Attempts)
	check("LastStatus", got.LastStatus == want.LastStatus, got.LastStatus, want.LastStatus)
	check("LastError", got.LastError == want.LastError, got.LastError, want.LastError)
	check("KeyHeader", got.KeyHeader == want.KeyHeader, got.KeyHeader, want.KeyHeader)
	check("Created", got.Created.Equal(want.Created), got.Created, want.Created)
	check("Updated", got.Updated.Equal(want.Updated), got.Updated, want.Updated)
	check("Owner", got.Owner == want.Owner, got.Owner, want.Owner)
	check("LeaseUntil", got.LeaseUntil.Equal(want.LeaseUntil), got.LeaseUntil, want.LeaseUntil)
	check("Redacted", got.Redacted == want.Redacted, got.Redacted, want.Redacted)
	check("Unreplayable", got.Unreplayable == want.Unreplayable, got.Unreplayable, want.Unreplayable)
	check("Body", bytes.Equal(got.Body, want.Body), string(got.Body), string(want.Body))
	check("Header", headerString(got.Header) == headerString(want.Header), got.Header, want.Header)
	check("Trace", got.Trace == want.Trace, got.Trace, want.Trace)
	check("History", historyString(got.History) == historyString(want.History), historyString(got.History), historyString(want.History))
	if len(diffs) > 0 {
		t.Fatalf("%s: record differs:\n\t%s", what, strings.Join(diffs, "\n\t"))
	}
}

// historyString shows a history, times by instant.
func historyString(h []idemstore.Attempt) string {
	var b strings.Builder
	b.WriteString("[")
	for i, a := range h {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "{%d sent=%d status=%d err=%q reason=%q}", a.At.UnixNano(), a.Sent, a.Status, a.Err, a.Reason)
	}
	b.WriteString("]")
	return b.String()
}

func headerString(h http.Header) string {
	if len(h) == 0 {
		return ""
	}
	var b strings.Builder
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range h {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(&b, "%s=%q;", k, h[k])
	}
	return b.String()
}

func (h *harness) reserve(t T, op idemstore.Operation) idemstore.Operation {
	t.Helper()
	rec, created, err := h.s.Reserve(t.Context(), op)
	if err != nil || !created {
		t.Fatalf("Reserve(%s): created=%v err=%v, want a new record", op.Key, created, err)
	}
	return rec
}

func (h *harness) get(t T, key string) idemstore.Operation {
	t.Helper()
	rec, err := h.s.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	return rec
}

func (h *harness) finish(t T, key string, o idemstore.Outcome) {
	t.Helper()
	if err := h.s.Finish(t.Context(), key, o); err != nil {
		t.Fatalf("Finish(%s): %v", key, err)
	}
}

func keysOf(ops []idemstore.Operation) []string {
	ks := []string{}
	for _, op := range ops {
		ks = append(ks, op.Key)
	}
	return ks
}

func wantKeys(t T, what string, ops []idemstore.Operation, err error, want ...string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if want == nil {
		want = []string{}
	}
	if got := keysOf(ops); !slices.Equal(got, want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}
