package pgstore_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// BenchmarkKeyedPOST sends small keyed POSTs to a loopback server at 1 and
// 32 in flight through plain net/http, idem on its bbolt journal and idem
// on pgstore, in one run:
//
//	go test -run '^$' -bench KeyedPOST -benchtime 3s ./pgstore
//
// For pgstore it reports, per request, the round trips the store made,
// those on the pre-send path (Reserve; a group of reservations made at
// once shares one), the
// transactions PostgreSQL committed (pg_stat_database.xact_commit) and its
// WAL fsyncs (pg_stat_wal.wal_sync). The server's counters include other
// sessions' work: run it on an otherwise idle server.
func BenchmarkKeyedPOST(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1","object":"charge","status":"succeeded"}`)
	}))
	defer srv.Close()
	body := []byte(`{"amount":4200,"currency":"eur","customer":"cus_123","description":"order 42"}`)

	for _, inflight := range []int{1, 32} {
		b.Run(fmt.Sprintf("plain/inflight=%d", inflight), func(b *testing.B) {
			base := newBase()
			defer base.CloseIdleConnections()
			post(b, (&http.Client{Transport: base}).Do, srv.URL, body, inflight)
		})
		b.Run(fmt.Sprintf("bbolt/inflight=%d", inflight), func(b *testing.B) {
			base := newBase()
			defer base.CloseIdleConnections()
			c, err := idem.Open(filepath.Join(b.TempDir(), "journal.db"), idem.WithBaseTransport(base))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			post(b, c.HTTPClient().Do, srv.URL, body, inflight)
		})
		b.Run(fmt.Sprintf("pgstore/inflight=%d", inflight), func(b *testing.B) {
			benchPG(b, srv.URL, body, inflight)
		})
	}
}

func newBase() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}

// post sends b.N POSTs with inflight of them in flight at once, timed.
func post(b *testing.B, do func(*http.Request) (*http.Response, error), url string, body []byte, inflight int) {
	b.Helper()
	b.ReportAllocs()
	b.ResetTimer()
	postN(b, do, url, body, inflight, int64(b.N))
	b.StopTimer()
}

// roundTrips counts a pool's round trips to PostgreSQL: each statement
// sent alone is one, and so is each batch (a pipeline of statements).
// Those that reserve are counted apart: they are the pre-send path.
type roundTrips struct{ all, reserve atomic.Int64 }

func isReserve(sql string) bool { return strings.Contains(sql, "ON CONFLICT DO NOTHING") }

// reservations is how many reservations batch carries: one per reserve
// statement, and a reserve of several rows (it unnests arrays) as many as
// its arrays are long.
func reservations(batch *pgx.Batch) int {
	n := 0
	for _, q := range batch.QueuedQueries {
		switch {
		case !isReserve(q.SQL):
		case strings.Contains(q.SQL, "unnest(") && len(q.Arguments) > 0:
			keys, _ := q.Arguments[0].([]string)
			n += len(keys)
		default:
			n++
		}
	}
	return n
}

func (c *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.all.Add(1)
	if isReserve(d.SQL) {
		c.reserve.Add(1)
	}
	return ctx
}

func (c *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	c.all.Add(1)
	if reservations(d.Batch) > 0 {
		c.reserve.Add(1)
	}
	return ctx
}

func (c *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// serverCounters reads the database's committed transactions and the
// cluster's WAL fsyncs.
func serverCounters(b *testing.B, ctx context.Context, dsn string) (commits, syncs int64) {
	b.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), (SELECT wal_sync FROM pg_stat_wal)`).Scan(&commits, &syncs)
	if err != nil {
		b.Fatal(err)
	}
	return commits, syncs
}

func benchPG(b *testing.B, url string, body []byte, inflight int) {
	dsn := pgtest.DSN(b)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(max(4, inflight))
	var st roundTrips
	cfg.ConnConfig.Tracer = &st
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	store, err := pgstore.New(ctx, pool, pgstore.WithSchema(pgtest.Schema(b, dsn)))
	if err != nil {
		b.Fatal(err)
	}
	base := newBase()
	defer base.CloseIdleConnections()
	c := idem.New(store, idem.WithBaseTransport(base))
	st.all.Store(0)
	st.reserve.Store(0)
	// Backends publish their statistics when they exit: counters are read
	// after the pool is closed, by a connection of their own.
	commits0, syncs0 := serverCounters(b, ctx, dsn)
	post(b, c.HTTPClient().Do, url, body, inflight)
	if err := c.Close(); err != nil {
		b.Fatal(err)
	}
	pool.Close()
	commits1, syncs1 := serverCounters(b, ctx, dsn)
	n := float64(b.N)
	b.ReportMetric(float64(st.all.Load())/n, "roundtrips/op")
	b.ReportMetric(float64(st.reserve.Load())/n, "presend-roundtrips/op")
	b.ReportMetric(float64(commits1-commits0-1)/n, "commits/op") // less serverCounters' own
	b.ReportMetric(float64(syncs1-syncs0)/n, "walsyncs/op")
}
