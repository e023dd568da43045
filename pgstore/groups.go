package pgstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
)

// markGroups is the group commit of Attempt and Finish, as reserver is
// Reserve's: one goroutine sends every mark queued while its last group
// ran as one pipeline, one transaction, committed asynchronously.
type markGroups struct {
	pool  *pgxpool.Pool
	mu    sync.Mutex
	queue []*markCall
	wake  chan struct{}
	stop  chan struct{}
	done  chan struct{}
}

type markCall struct {
	m  *mark
	ok chan bool // whether the group committed; buffered
}

func newMarkGroups(pool *pgxpool.Pool) *markGroups {
	g := &markGroups{pool: pool, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go g.run()
	return g
}

// do writes m in a group and reports whether the group committed; if it
// did, m.result is nil or an error matching idem.ErrNotFound.
func (g *markGroups) do(m *mark) bool {
	c := &markCall{m: m, ok: make(chan bool, 1)}
	g.mu.Lock()
	select {
	case <-g.stop:
		g.mu.Unlock()
		return false
	default:
	}
	g.queue = append(g.queue, c)
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
	return <-c.ok
}

func (g *markGroups) run() {
	defer close(g.done)
	for {
		select {
		case <-g.stop:
			g.mu.Lock()
			for _, c := range g.queue {
				c.ok <- false
			}
			g.queue = nil
			g.mu.Unlock()
			return
		case <-g.wake:
		}
		for {
			g.mu.Lock()
			n := min(len(g.queue), markBatch)
			group := g.queue[:n:n]
			g.queue = g.queue[n:]
			g.mu.Unlock()
			if n == 0 {
				break
			}
			g.send(group)
		}
	}
}

func (g *markGroups) send(group []*markCall) {
	ctx, cancel := context.WithTimeout(context.Background(), markTryTimeout)
	defer cancel()
	b := &pgx.Batch{}
	for _, c := range group {
		b.Queue(c.m.sql, c.m.args...)
	}
	br := g.pool.SendBatch(ctx, b)
	failed := false
	for _, c := range group {
		tag, err := br.Exec()
		switch {
		case err != nil:
			failed = true
		case tag.RowsAffected() == 0:
			c.m.result = fmt.Errorf("pgstore: %s %s: %w", c.m.what, c.m.key, idem.ErrNotFound)
		}
	}
	ok := br.Close() == nil && !failed
	for _, c := range group {
		c.ok <- ok
	}
}

func (g *markGroups) close() {
	g.mu.Lock()
	close(g.stop)
	g.mu.Unlock()
	<-g.done
}
