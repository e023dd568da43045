package pgstore_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemgo/idem/internal/crashtest"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// TestMain runs a fleet replica when this binary was started as one (see
// TestFleetChaos), and otherwise runs the tests and fails if any goroutine
// outlives them.
func TestMain(m *testing.M) {
	if crashtest.Mode() == modeFleet {
		os.Exit(fleetChild())
	}
	pgtest.Announce("pgstore")
	goleak.VerifyTestMain(m)
}
