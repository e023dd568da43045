package pgstore_test

import (
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
	"github.com/idemgo/idem/storetest"
)

// TestConformance runs the KeyStore contract suite against PostgreSQL, each
// subtest on a schema of its own; Reopen opens a second Store on the closed
// one's schema, as a restarted replica would. The store runs the SQL it
// runs in production, which judges leases by the database's clock: a
// clockedStore sets that clock to the suite's synthetic times.
func TestConformance(t *testing.T) {
	dsn := pgtest.DSN(t)
	storetest.Run(t, storetest.Config{
		Open: func(t *testing.T) idem.KeyStore { return openClocked(t, pgtest.Schema(t, dsn)) },
		Reopen: func(t *testing.T, closed idem.KeyStore) idem.KeyStore {
			return openClocked(t, closed.(*clockedStore).Schema())
		},
	})
}
