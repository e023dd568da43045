package pgstore_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

// TestInDoubtKeepsDeadlineWhilePostgresStalls: a payment whose 2 s
// deadline ends while the provider is slow, with PostgreSQL black-holed
// meanwhile, returns while PostgreSQL still stalls (its marks go on in
// the background, bounded by the caller's deadline plus idem's in-doubt
// grace of 1 s), and stays in doubt: pending, never finished by
// assumption, its attempt recorded once PostgreSQL answers again.
func TestInDoubtKeepsDeadlineWhilePostgresStalls(t *testing.T) {
	p, s, direct := viaProxy(t)
	entered := make(chan struct{}, 1)
	srv := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-r.Context().Done() // a provider slower than the caller's deadline
	}))
	defer srv.Close()
	c := idem.New(s, quickRetries, idem.WithMaxAttempts(1))
	defer c.Close()
	ctx := testContext(t)

	errCallerDeadline := errors.New("the caller's 2 s deadline")
	dctx, cancel := context.WithTimeoutCause(ctx, 2*time.Second, errCallerDeadline)
	defer cancel()
	paid := make(chan error, 1)
	go func() {
		_, err := pay(dctx, c.HTTPClient(), srv.URL, "slow")
		paid <- err
	}()
	<-entered
	p.Stall() // PostgreSQL stops answering while the provider is slow
	var err error
	select {
	case err = <-paid:
	case <-time.After(30 * time.Second): // a bound for the failure only
		p.Flow()
		<-paid
		t.Fatal("the call did not return while PostgreSQL stalled: its in-doubt marks wait for the database without a bound")
	}
	p.Flow()
	require.Error(t, err)
	assert.ErrorIs(t, err, errCallerDeadline)
	var ie *idem.Error
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, idem.StatePending, ie.State, "in doubt")

	key := keyOf(t, direct, "pay:slow")
	require.Eventually(t, func() bool {
		rec, err := direct.Get(ctx, key)
		return err == nil && rec.Attempts == 1
	}, time.Minute, 20*time.Millisecond, "the attempt mark is written once PostgreSQL answers")
	rec, err := direct.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, rec.State, "the operation stays in doubt, never finished by assumption")
}
