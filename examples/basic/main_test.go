package main

import "testing"

// TestBasic runs the program: it fails unless the card was charged once,
// under one key, after a lost response and a 503.
func TestBasic(t *testing.T) {
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
