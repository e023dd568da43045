package wait

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestFor(t *testing.T) {
	closed := make(chan struct{})
	close(closed)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		done    <-chan struct{}
		wantErr bool
	}{
		{"done", context.Background(), closed, false},
		{"done and ctx ended: done wins", ended, closed, false},
		{"ctx ended", ended, make(chan struct{}), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := For(tt.ctx, "the thing", tt.done)
			if (err != nil) != tt.wantErr {
				t.Fatalf("For = %v, want error %v", err, tt.wantErr)
			}
			if err == nil {
				return
			}
			var we *Error
			if !errors.As(err, &we) || we.What != "the thing" || !errors.Is(err, context.Canceled) {
				t.Errorf("For = %#v, want an *Error naming the thing and matching context.Canceled", err)
			}
			if got, want := err.Error(), "still waiting for the thing: context canceled"; got != want {
				t.Errorf("Error() = %q, want %q", got, want)
			}
		})
	}
}

func TestGroupAndDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var wg sync.WaitGroup
		wg.Add(1)
		ch := Group(&wg)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := For(ctx, "wg", ch); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("For(Group) with the group busy = %v, want DeadlineExceeded", err)
		}
		wg.Done()
		if err := For(context.Background(), "wg", ch); err != nil {
			t.Errorf("For(Group) after Done = %v", err)
		}

		release := make(chan struct{})
		err := Do(ctx, "fn", func(context.Context) error { <-release; return nil })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Do of a stuck fn = %v, want DeadlineExceeded", err)
		}
		close(release)
		boom := errors.New("boom")
		if err := Do(context.Background(), "fn", func(context.Context) error { return boom }); err != boom {
			t.Errorf("Do = %v, want fn's error", err)
		}
	})
}

func TestGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		parent, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ctx, stop := Grace(parent, time.Second)
		defer stop()
		<-parent.Done()
		if ctx.Err() != nil {
			t.Fatal("Grace's context ended with its parent")
		}
		<-ctx.Done()
		if got := time.Since(start); got != 3*time.Second {
			t.Errorf("Grace's context ended after %v, want the parent's deadline plus the grace, 3s", got)
		}

		parent2, cancel2 := context.WithCancel(context.Background())
		ctx2, stop2 := Grace(parent2, time.Second)
		defer stop2()
		cancel2()
		at := time.Now()
		<-ctx2.Done()
		if got := time.Since(at); got != time.Second {
			t.Errorf("Grace's context ended %v after its parent was cancelled, want 1s", got)
		}
		if !errors.Is(context.Cause(ctx2), context.Canceled) {
			t.Errorf("cause %v, want the parent's", context.Cause(ctx2))
		}
	})
}
