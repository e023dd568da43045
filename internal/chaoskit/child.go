package chaoskit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/crashtest"
)

// Environment of a chaos child that every chaos test gives it; the rest is
// each test's own.
const (
	EnvURL     = "IDEM_CHAOS_URL"     // the provider
	EnvOps     = "IDEM_CHAOS_OPS"     // operations to drive
	EnvWorkers = "IDEM_CHAOS_WORKERS" // operations in flight at once
)

// Env is the part of a chaos child's environment that every chaos test
// gives it.
type Env struct {
	URL     string
	Ops     int
	Workers int // at least 1 as read by ReadEnv
}

// Vars returns e as environment variables ("NAME=value").
func (e Env) Vars() []string {
	return []string{
		EnvURL + "=" + e.URL,
		EnvOps + "=" + strconv.Itoa(e.Ops),
		EnvWorkers + "=" + strconv.Itoa(e.Workers),
	}
}

// ReadEnv reads a child's Env. The number of operations must be given; a
// missing or bad number of workers is 1.
func ReadEnv() (Env, error) {
	e := Env{URL: os.Getenv(EnvURL)}
	var err error
	if e.Ops, err = strconv.Atoi(os.Getenv(EnvOps)); err != nil {
		return e, fmt.Errorf("chaoskit: %s: %w", EnvOps, err)
	}
	e.Workers, err = strconv.Atoi(os.Getenv(EnvWorkers))
	if err != nil || e.Workers < 1 {
		e.Workers = 1
	}
	return e, nil
}

// Life bounds one life of a child process: past limit the process exits
// on its own with status 4 (so that no wait of the parent can hang), and
// the context it returns ends. Call stop when the life ends normally.
func Life(what string, limit time.Duration) (ctx context.Context, stop func()) {
	watchdog := time.AfterFunc(limit, func() {
		fmt.Fprintln(os.Stderr, what+": out of time")
		os.Exit(4)
	})
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	return ctx, func() {
		cancel()
		watchdog.Stop()
	}
}

// Fatal says a child's setup error to the parent ("fatal <msg>", on one
// line) and returns the child's exit status for it, 2.
func Fatal(err error) int {
	crashtest.Emit("fatal", strings.ReplaceAll(err.Error(), "\n", " "))
	return 2
}

// Retry is the retry policy of a chaos client: fast, so that a run spends
// its time on faults and crashes, not on waiting.
var Retry = idem.RetryPolicy{Initial: time.Millisecond, Max: 20 * time.Millisecond, RetryAfterCap: 10 * time.Millisecond}

// ClientOptions are the options of a chaos client: every attempt goes
// through SendRT over base (see SendRT for a nil base), Retry, and workers
// operations resumed at once.
func ClientOptions(base http.RoundTripper, workers int) []idem.Option {
	return []idem.Option{
		idem.WithBaseTransport(SendRT{Base: base}),
		idem.WithRetryPolicy(Retry),
		idem.WithResumeConcurrency(max(workers, 1)),
	}
}

// SendRT announces each attempt to the parent ("send <key>") before it
// sends it with Base. A nil Base is an http.Transport without keep-alives,
// so that net/http resends nothing silently.
type SendRT struct{ Base http.RoundTripper }

var noKeepAlives http.RoundTripper = &http.Transport{DisableKeepAlives: true}

// RoundTrip implements http.RoundTripper.
func (s SendRT) RoundTrip(r *http.Request) (*http.Response, error) {
	crashtest.Emit("send", r.Header.Get("Idempotency-Key"))
	base := s.Base
	if base == nil {
		base = noKeepAlives
	}
	return base.RoundTrip(r)
}

// Lookup finds the operation a journal holds under a name, or returns
// idem.ErrNotFound. (*idem.BoltStore).Named is one.
type Lookup func(ctx context.Context, name string) (idem.Operation, error)

// Succeeded reports whether the journal records the operation name as
// succeeded; an operation it does not hold did not.
func Succeeded(ctx context.Context, lookup Lookup, name string) (bool, error) {
	op, err := lookup(ctx, name)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return op.State == idem.StateSucceeded, nil
}

// Done reports, for each name, whether the journal records its operation
// as succeeded, and how many are not.
func Done(ctx context.Context, lookup Lookup, names []string) (done []bool, todo int, err error) {
	done = make([]bool, len(names))
	for i, name := range names {
		if done[i], err = Succeeded(ctx, lookup, name); err != nil {
			return nil, 0, err
		}
		if !done[i] {
			todo++
		}
	}
	return done, todo, nil
}

// Pool calls do for every index jobs yields, workers at a time, and
// returns how many calls reported failure.
func Pool(workers int, jobs iter.Seq[int], do func(i int) bool) int {
	ch := make(chan int)
	var mu sync.Mutex
	failed := 0
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() {
			for i := range ch {
				if !do(i) {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
		})
	}
	for i := range jobs {
		ch <- i
	}
	close(ch)
	wg.Wait()
	return failed
}

// Try calls attempt (with its number, from 0) up to tries times, pausing
// between calls, until it reports done, and reports whether one did. It
// gives up early when ctx ends or attempt returns an error.
func Try(ctx context.Context, tries int, pause time.Duration, attempt func(try int) (done bool, err error)) bool {
	for try := range tries {
		if try > 0 {
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return false
			}
		}
		done, err := attempt(try)
		if err != nil {
			return false
		}
		if done {
			return true
		}
	}
	return false
}

// Post returns a JSON POST of body to url.
func Post(ctx context.Context, url, body string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

// Answer reads and closes resp and reports whether it is a 2xx answer for
// the order want: a JSON object whose "order" is want.
func Answer[T comparable](resp *http.Response, want T) bool {
	defer resp.Body.Close()
	var got struct{ Order T }
	err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&got)
	return resp.StatusCode/100 == 2 && err == nil && got.Order == want
}

// Status is a resumed operation's status for its "resumed" line: the
// answer's status code, or "error" without an answer.
func Status(resp *http.Response) string {
	if resp == nil {
		return "error"
	}
	return strconv.Itoa(resp.StatusCode)
}
