package pgstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
	"github.com/idemgo/idem/storetest"
)

// TestConformance runs the KeyStore contract suite against PostgreSQL, each
// subtest on a schema of its own; Reopen opens a second Store on the closed
// one's schema, as a restarted replica would.
func TestConformance(t *testing.T) {
	dsn := pgtest.DSN(t)
	storetest.Run(t, storetest.Config{
		Open: func(t *testing.T) idem.KeyStore { return openStore(t, pgstore.WithCallerLeaseTimes()) },
		Reopen: func(t *testing.T, closed idem.KeyStore) idem.KeyStore {
			s, err := pgstore.Open(testContext(t), dsn, pgstore.WithSchema(closed.(*pgstore.Store).Schema()), pgstore.WithCallerLeaseTimes())
			require.NoError(t, err)
			return s
		},
	})
}
