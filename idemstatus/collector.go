// Package idemstatus shows what idem is doing, live, to operators: a
// Collector that counts idem's events through Hooks, and an http.Handler
// an application mounts (as it mounts net/http/pprof or expvar) that shows
// the pending operations, the oldest one in doubt, the counters and the
// operations that ended recently, as an HTML table or JSON.
//
//	store, err := idem.OpenBoltStore(path, nil)
//	...
//	col := idemstatus.NewCollector(0)
//	client := idem.New(store, idem.WithHooks(col.Hooks()))
//	mux.Handle("/debug/idem", idemstatus.Handler(store, col))
//
// Nothing listens on a port of its own, and the page shows no request
// header values or bodies: mount it where only operators can reach it,
// since it does show operation names and URLs (without their query).
package idemstatus

import (
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem"
)

// DefaultRecent is how many ended operations a Collector remembers when
// NewCollector is given 0.
const DefaultRecent = 100

// Collector counts idem's events and remembers the operations that ended
// last. Wire it with idem.WithHooks(c.Hooks()) or idem.WithRequestHooks.
// It is safe for concurrent use; its hooks take one short lock each.
type Collector struct {
	mu       sync.Mutex
	attempts map[string]int64 // by reason
	retries  map[string]int64 // by reason
	settled  map[idem.State]int64
	inDoubt  int64
	resumed  int64
	expired  int64
	recent   []Event // a ring of the last len(recent) events
	next     int     // where the next event goes in recent
	full     bool    // recent has wrapped
	now      func() time.Time
}

// NewCollector returns a Collector that remembers the last recent ended
// operations (0 means DefaultRecent, a negative number none).
func NewCollector(recent int) *Collector {
	if recent == 0 {
		recent = DefaultRecent
	}
	return &Collector{
		attempts: make(map[string]int64),
		retries:  make(map[string]int64),
		settled:  make(map[idem.State]int64),
		recent:   make([]Event, max(recent, 0)),
		now:      time.Now,
	}
}

// Event is how one operation ended, or was finished by Resume.
type Event struct {
	// Time is when the event happened.
	Time time.Time `json:"time"`
	// Kind is "settled", "in doubt", "resumed" or "expired".
	Kind string `json:"kind"`
	Key  string `json:"key"`
	Name string `json:"name,omitempty"`
	// Method and URL are the request's; the URL carries no query.
	Method string `json:"method"`
	URL    string `json:"url"`
	// State is the operation's state after the event.
	State string `json:"state"`
	// Attempts counts the requests this call wrote under the key.
	Attempts int `json:"attempts"`
	// Status is the last HTTP status (Resumed only), or 0.
	Status int `json:"status,omitempty"`
	// Err is the error's text (InDoubt and Resumed), or "".
	Err string `json:"error,omitempty"`
}

// Counts are a Collector's counters since it was made.
type Counts struct {
	// Attempts counts requests by how idem classified their outcome
	// ("200", "503", "connection failed", ...).
	Attempts map[string]int64 `json:"attempts_by_reason"`
	// Retries counts scheduled retries by the reason of the failed attempt.
	Retries map[string]int64 `json:"retries_by_reason"`
	// Settled counts operations whose caller received the answer, by the
	// state they settled in ("succeeded", "failed").
	Settled map[string]int64 `json:"settled_by_state"`
	// InDoubt counts operations left pending without an answer.
	InDoubt int64 `json:"in_doubt"`
	// Resumed counts operations Resume sent again.
	Resumed int64 `json:"resumed"`
	// Expired counts operations given up past the resend window.
	Expired int64 `json:"expired"`
}

// Total returns the sum of m's values.
func Total(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// Hooks returns the hooks that feed c. Every call returns a new *Hooks
// value feeding the same counters.
func (c *Collector) Hooks() *idem.Hooks {
	return &idem.Hooks{
		AttemptDone: func(a idem.AttemptInfo) {
			c.mu.Lock()
			c.attempts[reasonOf(a)]++
			c.mu.Unlock()
		},
		RetryScheduled: func(r idem.RetryInfo) {
			c.mu.Lock()
			c.retries[r.Reason]++
			c.mu.Unlock()
		},
		Settled: func(op idem.OperationInfo) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.settled[op.State]++
			c.remember("settled", op, 0, nil)
		},
		InDoubt: func(op idem.OperationInfo, err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.inDoubt++
			c.remember("in doubt", op, 0, err)
		},
		Resumed: func(op idem.OperationInfo, status int, err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.resumed++
			c.remember("resumed", op, status, err)
		},
		Expired: func(op idem.OperationInfo) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.expired++
			c.remember("expired", op, 0, nil)
		},
	}
}

// reasonOf is an attempt's reason, never empty.
func reasonOf(a idem.AttemptInfo) string {
	if a.Reason != "" {
		return a.Reason
	}
	if a.Status != 0 {
		return "status"
	}
	return "error"
}

// remember adds an event to the ring. c.mu is held.
func (c *Collector) remember(kind string, op idem.OperationInfo, status int, err error) {
	if len(c.recent) == 0 {
		return
	}
	e := Event{
		Time: c.now(), Kind: kind, Key: op.Key, Name: op.Name, Method: op.Method, URL: withoutQuery(op.URL),
		State: op.State.String(), Attempts: op.Attempts, Status: status,
	}
	if err != nil {
		e.Err = err.Error()
	}
	c.recent[c.next] = e
	c.next++
	if c.next == len(c.recent) {
		c.next, c.full = 0, true
	}
}

// Counts returns a copy of c's counters.
func (c *Collector) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := Counts{
		Attempts: make(map[string]int64, len(c.attempts)),
		Retries:  make(map[string]int64, len(c.retries)),
		Settled:  make(map[string]int64, len(c.settled)),
		InDoubt:  c.inDoubt, Resumed: c.resumed, Expired: c.expired,
	}
	for k, v := range c.attempts {
		out.Attempts[k] = v
	}
	for k, v := range c.retries {
		out.Retries[k] = v
	}
	for k, v := range c.settled {
		out.Settled[k.String()] = v
	}
	return out
}

// Recent returns the remembered events, newest first.
func (c *Collector) Recent() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.next
	if c.full {
		n = len(c.recent)
	}
	out := make([]Event, 0, n)
	for i := 1; i <= n; i++ {
		out = append(out, c.recent[(c.next-i+len(c.recent))%len(c.recent)])
	}
	return out
}

// withoutQuery returns u without its query and fragment, which may hold
// secrets or personal data.
func withoutQuery(u string) string {
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		return u[:i]
	}
	return u
}
