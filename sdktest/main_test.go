// Package sdktest_test drives idem under real SDKs (openai-go,
// anthropic-sdk-go, stripe-go) at their default retry settings, against
// servers on loopback. It is a module of its own so that idem's go.mod
// lists only what the library needs; run it with
//
//	cd sdktest && go test -race ./...
package sdktest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
