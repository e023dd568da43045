package idem

import (
	"context"
	"sync"
	"time"
)

// inflight is the set of operations this process is sending, by key and by
// name, so that no operation is sent twice at once: not by two calls, nor
// by a call and Resume. A call that finds its operation busy waits on the
// holder's channel, which is closed when the holder releases it.
type inflight struct {
	mu  sync.Mutex
	ids map[flightID]*flightEntry
}

// flightEntry is one operation in flight.
type flightEntry struct {
	done  chan struct{} // made when a call first waits; closed by release
	key   string        // the journaled key, once known
	since time.Time     // when it was marked in flight
}

// flightID names an operation in flight: by key, or by name.
type flightID struct {
	name bool
	id   string
}

// flights is the few flightIDs of one operation, kept by value so that
// marking an operation in flight does not allocate for them. e is its
// entry: set by the caller to one it holds (a call's, inside its
// operation), or made by acquire.
type flights struct {
	ids [2]flightID
	n   int
	e   *flightEntry
}

func (f *flights) add(id flightID) { f.ids[f.n] = id; f.n++ }

// flightIDs returns the ids of an operation: its key, and its name if it
// has one.
func flightIDs(key, name string) flights {
	fs := flights{ids: [2]flightID{{id: key}}, n: 1}
	if name != "" {
		fs.add(flightID{name: true, id: name})
	}
	return fs
}

// acquire marks the ids of fs in flight, all or none. If one is busy it
// returns the channel that is closed when its holder is done, and the
// holder's journaled key if it is known.
func (f *inflight) acquire(fs *flights) (wait <-chan struct{}, key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range fs.ids[:fs.n] {
		if e, busy := f.ids[id]; busy {
			if e.done == nil {
				e.done = make(chan struct{})
			}
			return e.done, e.key
		}
	}
	if f.ids == nil {
		f.ids = make(map[flightID]*flightEntry)
	}
	if fs.e == nil {
		fs.e = new(flightEntry)
	}
	// The entry is in no map now (a call's is released before it is
	// acquired again), so no one else reads it.
	*fs.e = flightEntry{since: time.Now()}
	if fs.n == 1 { // a key of its own; a name's key is known once reserved
		fs.e.key = fs.ids[0].id
	}
	for _, id := range fs.ids[:fs.n] {
		f.ids[id] = fs.e
	}
	return nil, ""
}

// setKey records the journaled key of the operation fs holds.
func (f *inflight) setKey(fs *flights, key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fs.e.key = key
}

// rekey moves the operation fs holds from its candidate key to key, the
// one the journal holds for its name. If key is busy it changes nothing
// and returns the channel to wait on.
func (f *inflight) rekey(fs *flights, key string) (wait <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := flightID{id: key}
	if e, busy := f.ids[id]; busy && e != fs.e {
		if e.done == nil {
			e.done = make(chan struct{})
		}
		return e.done
	}
	if f.ids[fs.ids[0]] == fs.e {
		delete(f.ids, fs.ids[0])
	}
	fs.ids[0] = id
	f.ids[id] = fs.e
	fs.e.key = key
	return nil
}

// release undoes acquire and wakes the calls waiting for the operation.
func (f *inflight) release(fs flights) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range fs.ids[:fs.n] {
		if f.ids[id] == fs.e {
			delete(f.ids, id)
		}
	}
	if fs.e != nil && fs.e.done != nil {
		close(fs.e.done)
	}
}

// runningSince returns the journaled keys of the operations in flight
// since before t, and whether any operation is in flight.
func (f *inflight) runningSince(t time.Time) (keys []string, busy bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, e := range f.ids {
		// Each entry is listed once, under its key id.
		if !id.name && id.id == e.key && e.since.Before(t) {
			keys = append(keys, e.key)
		}
	}
	return keys, len(f.ids) > 0
}

// calls counts the live calls of a Transport, so that Close can wait for
// them, and refuses new ones once closing began. A keyed call is counted
// by newOperation until its operation ends; an unkeyed one by
// roundTripUnkeyed while it runs.
type calls struct {
	mu      sync.Mutex
	n       int
	closing bool
	idle    chan struct{} // closed when n drops to 0 while closing
}

// begin counts a new call, or reports false once closing began.
func (c *calls) begin() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return false
	}
	c.n++
	return true
}

func (c *calls) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n--
	if c.n == 0 && c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
}

// close refuses new calls and returns a channel closed when none is left,
// and how many are still running.
func (c *calls) close() (<-chan struct{}, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closing = true
	ch := make(chan struct{})
	if c.n == 0 {
		close(ch)
	} else {
		c.idle = ch
	}
	return ch, c.n
}

// count returns how many calls are running.
func (c *calls) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// waitFor waits until ch is closed or ctx ends, and then returns nil or
// ctx's cause. (A wait for a time alone is sleep's.)
func waitFor(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
