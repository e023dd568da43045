package idem_test

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// TestShutdownBoundedWhileResumerBusy: Shutdown returns when its context
// ends, and Close after its 30 seconds, while the background resumer is
// stuck in the application's code (its Resume handler, or its prepare
// hook), and the error names what it was still waiting for.
func TestShutdownBoundedWhileResumerBusy(t *testing.T) {
	const every = time.Minute
	// busy returns the options of a Client whose background resumer blocks
	// in the application's code until hold is closed, and the channel that
	// says it got there.
	cases := []struct {
		name string
		busy func(hold <-chan struct{}, entered chan<- struct{}) []idem.Option
	}{
		{"blocked Resume handler", func(hold <-chan struct{}, entered chan<- struct{}) []idem.Option {
			return []idem.Option{idem.WithBackgroundResume(every, func(_ idem.Operation, r *http.Response, _ error) {
				closeResp(r)
				entered <- struct{}{}
				<-hold
			})}
		}},
		{"blocked prepare hook", func(hold <-chan struct{}, entered chan<- struct{}) []idem.Option {
			return []idem.Option{idem.WithBackgroundResume(every, nil), idem.WithResumePrepare(func(*http.Request) error {
				entered <- struct{}{}
				<-hold
				return nil
			})}
		}},
	}
	for _, tc := range cases {
		for _, how := range []string{"Shutdown", "Close"} {
			t.Run(tc.name+"/"+how, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					hold, entered := make(chan struct{}), make(chan struct{}, 16)
					rt := &scriptRT{steps: []step{fail(errReset)}}
					c, _ := newTestClient(rt, append(tc.busy(hold, entered), idem.WithMaxAttempts(1))...)
					_, err := post(t, context.Background(), c.HTTPClient(), "{}") // rt.sent is the resumer's from now on
					require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
					<-entered // fake time: the resumer's tick came and it is stuck

					bound := time.Second
					shut := make(chan error, 1)
					go func() {
						if how == "Close" {
							bound = 30 * time.Second
							shut <- c.Close()
							return
						}
						ctx, cancel := context.WithTimeout(context.Background(), bound)
						defer cancel()
						shut <- c.Shutdown(ctx)
					}()
					time.Sleep(31 * time.Second) // fake time: past both bounds
					synctest.Wait()
					returned := false
					select {
					case err = <-shut:
						returned = true
					default:
					}
					close(hold) // let the resumer go, so that no goroutine is left blocked
					if !returned {
						err = <-shut
					}
					require.True(t, returned, "%s did not return within its bound while the background resumer was stuck", how)
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					assert.ErrorContains(t, err, "background resumer", "the error names what Shutdown gave up waiting for")
				})
			})
		}
	}
}
