package boltjournal_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemgo/idem/internal/crashtest"
)

// crashChildren are the crash-test child modes (the tests' init functions
// add them); TestMain runs them instead of tests.
var crashChildren = map[string]func() int{}

// TestMain runs a crash-test child's mode when this binary was started as
// one, and otherwise runs the tests and fails if any goroutine outlives them.
func TestMain(m *testing.M) {
	if child, ok := crashChildren[crashtest.Mode()]; ok {
		os.Exit(child())
	}
	goleak.VerifyTestMain(m)
}
