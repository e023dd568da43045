package idemserver

import (
	"container/list"
	"sync"
	"time"
)

// answerCache holds finished answers in memory in front of the Store (see
// WithAnswerCache). It is never the only copy: an answer enters it after
// the store holds it.
type answerCache struct {
	mu    sync.Mutex
	max   int
	bytes int
	lru   list.List // of *cached, most recently used first
	byID  map[string]*list.Element
}

// cached is one answer in the cache.
type cached struct {
	id, fp string
	resp   *Response
	until  time.Time
	size   int
}

func newAnswerCache(maxBytes int) *answerCache {
	if maxBytes <= 0 {
		return nil
	}
	return &answerCache{max: maxBytes, byID: make(map[string]*list.Element)}
}

// get returns the answer of id live at now, and whether its fingerprint is
// fp; ok is false if the cache holds none.
func (c *answerCache) get(id, fp string, now time.Time) (resp *Response, match, ok bool) {
	if c == nil {
		return nil, false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.byID[id]
	if e == nil {
		return nil, false, false
	}
	a := e.Value.(*cached)
	if !a.until.After(now) {
		c.remove(e)
		return nil, false, false
	}
	c.lru.MoveToFront(e)
	return a.resp, a.fp == fp, true
}

// put caches the answer of id, stored until until, evicting the least
// recently used answers past the bound. An answer larger than the bound is
// not cached.
func (c *answerCache) put(id, fp string, resp *Response, until time.Time) {
	if c == nil {
		return
	}
	size := 256 + len(id) + len(fp) + len(resp.Body)
	for k, vs := range resp.Header {
		size += len(k) + 16
		for _, v := range vs {
			size += len(v) + 16
		}
	}
	if size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.byID[id]; e != nil {
		c.remove(e)
	}
	c.byID[id] = c.lru.PushFront(&cached{id: id, fp: fp, resp: resp, until: until, size: size})
	c.bytes += size
	for c.bytes > c.max {
		c.remove(c.lru.Back())
	}
}

// sweep drops the answers expired at or before now.
func (c *answerCache) sweep(now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for e := c.lru.Front(); e != nil; {
		next := e.Next()
		if !e.Value.(*cached).until.After(now) {
			c.remove(e)
		}
		e = next
	}
}

func (c *answerCache) remove(e *list.Element) {
	a := c.lru.Remove(e).(*cached)
	delete(c.byID, a.id)
	c.bytes -= a.size
}
