package idem

import (
	"context"
	"sync"
	"testing"
	"time"
)

// clockMemory is a MemoryStore with a clock of its own.
type clockMemory struct{ *MemoryStore }

func (clockMemory) Now(context.Context) (time.Time, error) { return time.Now(), nil }

// TestBackgroundWorkAfterShutdown has a goroutine read the journal's clock
// (as a call that outlived its Shutdown does) with a measurement of the
// store's clock due every time, which starts it in the background, while
// the Client shuts down and waits for its background work: no work may
// start once that wait began (a WaitGroup's Add concurrent with its Wait,
// which the race detector reports and which can panic).
func TestBackgroundWorkAfterShutdown(t *testing.T) {
	for range 200 {
		c := New(clockMemory{NewMemoryStore()})
		j := c.t.j
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				j.measured.Store(0)
				j.now()
			}
		})
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
	}
}
