package pgstore_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// BenchmarkServerSide measures requests per second over loopback HTTP
// through one handler, side by side in one run: bare net/http, the
// middleware on MemoryStore, on BoltStore, on ServerStore, and on
// ServerStore with the handler writing its order row in the request's
// transaction (pgstore.Tx). Every keyed request has a new key. The handler
// of every variant but pg+tx writes nothing of its own; in pg+tx it
// inserts one row, bare in a transaction of its own, through the
// middleware in the request's transaction. Each variant reports req/s and its ratio to bare measured
// in the same sub-benchmark. It reports; it asserts nothing.
//
//	IDEM_TEST_POSTGRES=postgres://... go test -run '^$' -bench BenchmarkServerSide -benchtime 2000x ./pgstore
func BenchmarkServerSide(b *testing.B) {
	dsn := pgtest.DSN(b)
	variants := []string{"memory", "bolt", "pg", "pg+tx"}
	for _, v := range variants {
		for _, inflight := range []int{1, 32} {
			b.Run(fmt.Sprintf("store=%s/inflight=%d", v, inflight), func(b *testing.B) {
				var (
					store idemserver.Store
					table string
				)
				switch v {
				case "memory":
					store = idemserver.NewMemoryStore()
				case "bolt":
					s, err := idemserver.OpenBoltStore(filepath.Join(b.TempDir(), "keys.db"), nil)
					if err != nil {
						b.Fatal(err)
					}
					store = s
				default:
					schema := pgtest.Schema(b, dsn)
					s, err := pgstore.OpenServerStore(b.Context(), dsn+"&pool_max_conns=80", pgstore.WithSchema(schema))
					if err != nil {
						b.Fatal(err)
					}
					store = s
					table = pgx.Identifier{schema, "orders"}.Sanitize()
					if _, err := s.Pool().Exec(b.Context(), `CREATE TABLE `+table+` (key text NOT NULL)`); err != nil {
						b.Fatal(err)
					}
				}
				defer store.Close()
				handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					io.Copy(io.Discard, r.Body)
					if v == "pg+tx" {
						// Through the middleware, in the request's transaction;
						// bare, in a transaction of its own.
						var db interface {
							Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
						} = store.(*pgstore.ServerStore).Pool()
						if tx := pgstore.Tx(r.Context()); tx != nil {
							db = tx
						}
						if _, err := db.Exec(r.Context(), `INSERT INTO `+table+` (key) VALUES ('k')`); err != nil {
							http.Error(w, err.Error(), http.StatusInternalServerError)
							return
						}
					}
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusCreated)
					io.WriteString(w, `{"id":"ord_1","status":"created"}`)
				})
				mw := idemserver.New(store, idemserver.WithSingleTenant(), idemserver.WithSweepInterval(-1))
				defer mw.Close()
				mux := http.NewServeMux()
				mux.Handle("/bare", handler)
				mux.Handle("/mw", mw.Required(handler))
				srv := httptest.NewServer(mux)
				defer srv.Close()
				tr := &http.Transport{MaxIdleConnsPerHost: inflight}
				defer tr.CloseIdleConnections()
				hc := &http.Client{Transport: tr}

				serverLoad(b, hc, srv.URL+"/bare", inflight, inflight, "")
				b.ResetTimer()
				bare := serverLoad(b, hc, srv.URL+"/bare", inflight, b.N, "")
				keyed := serverLoad(b, hc, srv.URL+"/mw", inflight, b.N, fmt.Sprintf("k%d-", inflight))
				b.StopTimer()
				b.ReportMetric(float64(b.N)/bare.Seconds(), "bare-req/s")
				b.ReportMetric(float64(b.N)/keyed.Seconds(), "mw-req/s")
				b.ReportMetric(bare.Seconds()/keyed.Seconds(), "mw/bare")
			})
		}
	}
}

// serverLoad sends n POSTs to url from inflight goroutines and returns how
// long they took; with a key prefix each carries a new key.
func serverLoad(b *testing.B, hc *http.Client, url string, inflight, n int, prefix string) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range inflight {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":4200,"currency":"eur"}`))
				if prefix != "" {
					req.Header.Set("Idempotency-Key", prefix+strconv.FormatInt(i, 10))
				}
				resp, err := hc.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					b.Errorf("status %d: %s", resp.StatusCode, body)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}
