package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain runs the shop when the test binary was re-executed as one, as
// the demo re-executes itself.
func TestMain(m *testing.M) {
	if os.Getenv(envRole) == roleShop {
		os.Exit(shopMain())
	}
	os.Exit(m.Run())
}

// TestCheckout runs the whole demo, with this test binary as the shop.
func TestCheckout(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	var out bytes.Buffer
	rep, err := run(&out, exe, t.TempDir())
	t.Log("\n" + out.String())
	require.NoError(t, err)

	assert.Equal(t, orders, rep.Orders)
	assert.Equal(t, orders, rep.Paid, "every order charged")
	assert.Zero(t, rep.Duplicates)
	assert.Zero(t, rep.Lost)
	assert.True(t, rep.Killed, "the first shop died of SIGKILL")
	assert.Positive(t, rep.Resumed, "the payment held at the crash was resumed")
	assert.Positive(t, rep.Replays, "the held payment's resend was replayed")
	assert.Greater(t, rep.Attempts, orders, "faults caused retries")
	assert.Contains(t, out.String(), rep.Journal)
	assert.FileExists(t, rep.Journal)
}

// TestReportSaysWhatResumeFinished: Resume finishes what the journal held
// pending at the kill, which includes answers the shop had received and
// counted as paid whose finish marks the kill cut off; the report said
// they were all "in flight at the crash" and all kept "from the shop".
func TestReportSaysWhatResumeFinished(t *testing.T) {
	var out bytes.Buffer
	Report{Orders: 100, Paid: 100, Attempts: 104, Resumed: 4, Killed: true, Journal: "/tmp/j/journal.db"}.write(&out)
	assert.NotContains(t, out.String(), "in flight at the crash,")
	assert.Contains(t, out.String(), "answered but not yet marked")
	assert.Contains(t, out.String(), "from the shop or from its journal")
}
