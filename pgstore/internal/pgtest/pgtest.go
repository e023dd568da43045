// Package pgtest gives each test a PostgreSQL schema of its own on the
// server named by IDEM_TEST_POSTGRES.
//
// Without that variable the tests that need PostgreSQL skip with a one-line
// reason, so a newcomer's `go test ./...` passes without a server; with
// CI=true they fail instead, so CI cannot go green without having run them.
// .ci/run starts a local server and sets the variable.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names the environment variable that holds the test server's URL,
// for example postgres://idem:idem@127.0.0.1:5432/idem_test.
const EnvDSN = "IDEM_TEST_POSTGRES"

// Announce prints one line to standard error when the tests that need
// PostgreSQL will skip, so that `go test` (which shows skips only with -v)
// does not report a bare "ok" for tests that did not run. Call it from
// TestMain.
func Announce(pkg string) {
	if os.Getenv(EnvDSN) == "" && os.Getenv("CI") != "true" {
		fmt.Fprintf(os.Stderr, "%s: PostgreSQL tests skipped: set %s=postgres://user:pass@127.0.0.1:5432/db to run them\n", pkg, EnvDSN)
	}
}

// DSN returns the test server's URL. Without one it skips t, or fails it
// when CI=true.
func DSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set and CI=true: the PostgreSQL tests are required in CI (.ci/run starts a server)", EnvDSN)
		}
		t.Skipf("no PostgreSQL: set %s=postgres://... to run this test", EnvDSN)
	}
	return dsn
}

// Schema returns the name of a new, unused schema for t and drops it, with
// everything in it, when t ends (unless IDEM_TEST_KEEP_SCHEMA=1, to look at
// it after a failure). The schema itself is created by whoever uses it first.
func Schema(t testing.TB, dsn string) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := "idemtest_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if os.Getenv("IDEM_TEST_KEEP_SCHEMA") == "1" {
			t.Logf("pgtest: kept schema %s", name)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
		}
	})
	return name
}
