package main

import (
	"os"
	"strings"
	"testing"

	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// TestMain runs a replica when the test binary was re-executed as one, as
// the program re-executes itself.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "replica" {
		if err := replica(os.Args[2], os.Args[3:]); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	pgtest.Announce("pgstore/examples/fleet")
	os.Exit(m.Run())
}

// TestFleet runs the whole program, with this test binary as the
// replicas. run fails unless every order was charged exactly once under
// one key.
func TestFleet(t *testing.T) {
	dsn := pgtest.DSN(t)
	var out strings.Builder
	if err := run(t.Context(), dsn, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
}
