package pgstore_test

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// withParam adds a query parameter to a PostgreSQL URL.
func withParam(dsn, kv string) string {
	if strings.Contains(dsn, "?") {
		return dsn + "&" + kv
	}
	return dsn + "?" + kv
}

// TestRenewalsNotStarvedByRequestTransactions fills the pool with request
// transactions: pool_max_conns=2, and two handlers that each hold their
// pgstore.Tx for three leases. Their renewals must still go through, so
// neither is fenced: both answer 201, not 503 "lock lost".
func TestRenewalsNotStarvedByRequestTransactions(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	s := openServerStore(t, withParam(dsn, "pool_max_conns=2"), schema)
	const lease = 2 * time.Second
	var held sync.WaitGroup
	held.Add(2)
	h := idemserver.New(s, idemserver.WithLease(lease), idemserver.WithSweepInterval(-1), idemserver.WithSingleTenant()).Required(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx := pgstore.Tx(r.Context())
			if _, err := tx.Exec(r.Context(), `SELECT 1`); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			held.Done()
			held.Wait() // both connections are held by request transactions
			select {
			case <-time.After(3 * lease): // a slow handler, past its lease
			case <-r.Context().Done():
				http.Error(w, "fenced: "+r.Context().Err().Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
	var wg sync.WaitGroup
	codes := make([]int, 2)
	bodies := make([]string, 2)
	for i := range 2 {
		wg.Go(func() {
			w := postKey(t, h, "slow-"+strconv.Itoa(i), "x")
			codes[i], bodies[i] = w.Code, w.Body.String()
		})
	}
	wg.Wait()
	for i := range 2 {
		assert.Equal(t, http.StatusCreated, codes[i], "request %d: %s", i, bodies[i])
	}
}
