package main

import (
	"os"
	"testing"
)

// TestMain runs the shop when the test binary was re-executed as one, as
// the program re-executes itself.
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == "shop" {
		if err := shop(os.Args[2], os.Args[3]); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestCrashResume runs the whole program, with this test binary as the
// shop that is killed. run fails unless the card was charged exactly once,
// one operation was resumed and the provider saw one key.
func TestCrashResume(t *testing.T) {
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
