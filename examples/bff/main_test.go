package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBFF runs the whole demo on the PostgreSQL server named by
// IDEM_TEST_POSTGRES and checks its report and output. Without one it
// skips, or fails with CI=true.
func TestBFF(t *testing.T) {
	dsn := os.Getenv("IDEM_TEST_POSTGRES")
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("IDEM_TEST_POSTGRES is not set and CI=true")
		}
		t.Skip("no PostgreSQL: set IDEM_TEST_POSTGRES=postgres://... to run this test")
	}
	dir := t.TempDir()
	var out bytes.Buffer
	rep, err := run(&out, dsn, dir)
	t.Log("\n" + out.String())
	require.NoError(t, err)

	assert.Equal(t, orders, rep.Orders)
	assert.Equal(t, orders, rep.ChargedOnce, "every order charged exactly once")
	assert.Zero(t, rep.ChargedTwice)
	assert.Zero(t, rep.NeverCharged)
	assert.Equal(t, orders, rep.WrittenOnce, "every order written exactly once")
	assert.Zero(t, rep.WrittenTwice)
	assert.Equal(t, orders, rep.Consistent, "every answer for an order the same")
	assert.GreaterOrEqual(t, rep.Answers, 2*orders, "each order answered, then answered again")
	assert.Positive(t, rep.Lost, "the app's network lost answers")
	assert.Positive(t, rep.Replays, "the BFF replayed stored answers")
	assert.Positive(t, rep.ProviderReplays, "the provider replayed lost answers by key")
	assert.Equal(t, orders, rep.Succeeded, "every order left succeeded: no late pending moved one back")
	assert.Zero(t, rep.EventsTwice, "no payment event handled twice")
	assert.Positive(t, rep.Stale, "late pending events answered stale")
	assert.Positive(t, rep.HookReplays, "redelivered events replayed by id")
	assert.Equal(t, orders, rep.MailedOnce, "every receipt sent exactly once")
	assert.Zero(t, rep.MailedTwice)
	assert.Equal(t, orders, rep.ReceiptsOnce, "every receipt recorded once by the worker")
	assert.Positive(t, rep.MailReplays, "the mail provider replayed lost answers by key")
	assert.Contains(t, out.String(), "every order charged exactly once and written exactly once; every app retry got the stored answer")
	assert.Contains(t, out.String(), "every payment applied once and in order; every receipt sent exactly once")
	assert.Contains(t, out.String(), dir)
}
