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
// The page lists the pending operations a page at a time with their total
// ("Showing 1–100 of 10,000"), each with why it is pending and what the
// operator can do. Give Handler WithResumePrepare when the application's
// Client has an idem.WithResumePrepare hook, so operations journaled
// without credentials are not marked as needing them.
//
// Nothing listens on a port of its own, and the page shows no request
// header values or bodies: mount it where only operators can reach it,
// since it does show operation names and URLs (without their query).
package idemstatus

import (
	"errors"
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
	resent   int64             // requests net/http wrote again on its own
	journal  map[string]int64  // failed journal writes by write
	live     map[string]LiveOp // by key: operations between their first attempt and their end
	recent   []Event           // a ring of the last len(recent) events
	next     int               // where the next event goes in recent
	full     bool              // recent has wrapped
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
		journal:  make(map[string]int64),
		live:     make(map[string]LiveOp),
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
	// Status is the last HTTP status the operation got, or 0.
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
	// Resent counts the requests net/http wrote again on its own after a
	// reused connection closed (idem.ErrTransportResent); they are among
	// Attempts, not Retries.
	Resent int64 `json:"resent_by_transport"`
	// JournalErrors counts failed journal writes by write ("reserve",
	// "attempt", "finish", "lease").
	JournalErrors map[string]int64 `json:"journal_errors,omitempty"`
}

// LiveOp is what a Collector saw of an operation that has not ended yet:
// the journal records attempts only when the call retries or ends, so the
// page takes an in-flight operation's attempts and last status from here.
type LiveOp struct {
	// Attempts counts every request written under the key: earlier ones
	// the journal counted and this call's.
	Attempts int `json:"attempts"`
	// Status is the last response's status, or 0; Reason idem's reading of
	// the last outcome.
	Status int    `json:"status,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// maxLive caps how many operations a Collector follows at once.
const maxLive = 10_000

// Live returns what c saw of the operation with key while it runs.
func (c *Collector) Live(key string) (LiveOp, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.live[key]
	return l, ok
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
			defer c.mu.Unlock()
			c.attempts[reasonOf(a)]++
			if errors.Is(a.Err, idem.ErrTransportResent) {
				c.resent++
			}
			if _, ok := c.live[a.Key]; !ok && len(c.live) >= maxLive {
				// Operations that end unsent after an attempt (the
				// connection failed every time) have no end event: start
				// afresh rather than grow.
				clear(c.live)
			}
			c.live[a.Key] = LiveOp{Attempts: a.Earlier + a.Attempt, Status: a.Status, Reason: a.Reason}
		},
		JournalError: func(e idem.JournalErrorInfo) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.journal[e.Write]++
			if e.Write == idem.WriteFinish {
				c.end(e.Key)
			}
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
			c.remember("settled", op, c.end(op.Key), nil)
		},
		InDoubt: func(op idem.OperationInfo, err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.inDoubt++
			c.remember("in doubt", op, c.end(op.Key), err)
		},
		Resumed: func(op idem.OperationInfo, status int, err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.resumed++
			c.end(op.Key)
			c.remember("resumed", op, status, err)
		},
		Expired: func(op idem.OperationInfo) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.expired++
			c.remember("expired", op, c.end(op.Key), nil)
		},
	}
}

// end forgets the live operation with key and returns its last status.
// c.mu is held.
func (c *Collector) end(key string) int {
	l := c.live[key]
	delete(c.live, key)
	return l.Status
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
		Time: c.now(), Kind: kind, Key: op.Key, Name: op.Name, Method: op.Method, URL: idem.TrimQuery(op.URL),
		State: op.State.String(), Attempts: op.Attempts, Status: status,
	}
	if err != nil {
		e.Err = idem.RedactText(err.Error()) // a *url.Error quotes the URL as sent
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
		InDoubt:  c.inDoubt, Resumed: c.resumed, Expired: c.expired, Resent: c.resent,
	}
	if len(c.journal) > 0 {
		out.JournalErrors = make(map[string]int64, len(c.journal))
		for k, v := range c.journal {
			out.JournalErrors[k] = v
		}
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
