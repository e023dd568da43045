package pgstore_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// BenchmarkDurable measures durable keyed POSTs (each call's reservation
// committed before its request is sent, its finish mark after) to a
// loopback server answering 201, at 1, 8 and 32 calls in flight per
// replica, side by side in one run:
//
//   - bbolt: idem.Open on a journal on disk (the package's TempDir, or
//     IDEM_BENCH_DIR when set; say where it lives when reporting);
//   - pgstore/replicas=1: one Store on PostgreSQL;
//   - pgstore/replicas=3: three Stores, each with a pool of its own, on one
//     schema, in this one process (as three replicas of a service would
//     share the schema), each with the stated calls in flight, so the
//     three carry three times the calls of one.
//
// Deterministic costs come first, counted by a pgx tracer on each pool:
// roundtrips/op (a statement sent alone is one, and so is a pipelined
// batch), statements/op, and tx/op (PostgreSQL transactions: every lone
// statement and every batch is one, as pgstore's Store begins none of its
// own). Then the measured ones: cpu-us/op (this process's user and system
// CPU: client, loopback server and store), pg-cpu-us/op (the CPU of the
// PostgreSQL backends serving the pools, read from /proc), and req/s.
//
//	IDEM_TEST_POSTGRES=... go test -run '^$' -bench Durable -benchtime 2000x ./pgstore
func BenchmarkDurable(b *testing.B) {
	if os.Getenv("IDEM_TEST_POSTGRES") == "" {
		b.Skip("IDEM_TEST_POSTGRES is not set: no PostgreSQL to measure pgstore on")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1"}`)
	}))
	defer srv.Close()
	body := []byte(`{"amount":4200,"currency":"eur","customer":"cus_123"}`)
	for _, inflight := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("bbolt/inflight=%d", inflight), func(b *testing.B) {
			dir := b.TempDir()
			if d := os.Getenv("IDEM_BENCH_DIR"); d != "" {
				var err error
				if dir, err = os.MkdirTemp(d, "durable"); err != nil {
					b.Fatal(err)
				}
				defer os.RemoveAll(dir)
			}
			base := newBase()
			defer base.CloseIdleConnections()
			c, err := idem.Open(filepath.Join(dir, "journal.db"), idem.WithBaseTransport(base))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			cpu := cpuNow()
			start := time.Now()
			post(b, c.HTTPClient().Do, srv.URL, body, inflight)
			report(b, b.N, time.Since(start), cpuNow()-cpu)
		})
		for _, replicas := range []int{1, 3} {
			b.Run(fmt.Sprintf("pgstore/replicas=%d/inflight=%d", replicas, inflight), func(b *testing.B) {
				benchReplicas(b, srv.URL, body, replicas, inflight)
			})
		}
	}
}

func benchReplicas(b *testing.B, url string, body []byte, replicas, inflight int) {
	dsn := pgtest.DSN(b)
	schema := pgtest.Schema(b, dsn)
	ctx := context.Background()
	tr := &counter{pids: map[uint32]bool{}}
	clients := make([]*idem.Client, replicas)
	for i := range clients {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = int32(max(4, inflight))
		cfg.ConnConfig.Tracer = tr
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		store, err := pgstore.New(ctx, pool, pgstore.WithSchema(schema))
		if err != nil {
			b.Fatal(err)
		}
		base := newBase()
		defer base.CloseIdleConnections()
		clients[i] = idem.New(store, idem.WithBaseTransport(base))
		defer clients[i].Close()
	}
	tr.reset()
	pg0 := tr.pgCPU()
	cpu := cpuNow()
	start := time.Now()
	var wg sync.WaitGroup
	per := (b.N + replicas - 1) / replicas
	b.ReportAllocs()
	b.ResetTimer()
	for _, c := range clients {
		wg.Go(func() { postN(b, c.HTTPClient().Do, url, body, inflight, int64(per)) })
	}
	wg.Wait()
	b.StopTimer()
	elapsed, used := time.Since(start), cpuNow()-cpu
	pgUsed := tr.pgCPU() - pg0
	n := per * replicas
	f := float64(n)
	b.ReportMetric(float64(tr.trips.Load())/f, "roundtrips/op")
	b.ReportMetric(float64(tr.stmts.Load())/f, "statements/op")
	b.ReportMetric(float64(tr.trips.Load())/f, "tx/op")
	b.ReportMetric(float64(pgUsed.Microseconds())/f, "pg-cpu-us/op")
	if g := float64(tr.groups.Load()); g > 0 {
		b.ReportMetric(float64(tr.reserved.Load())/g, "reserve-group")
		b.ReportMetric(float64(tr.groupNanos.Load())/g/1e6, "reserve-group-ms")
	}
	report(b, n, elapsed, used)
}

// postN sends n POSTs with inflight of them in flight at once (for one
// replica of several: its share), untimed; post is its timed form.
func postN(b *testing.B, do func(*http.Request) (*http.Response, error), url string, body []byte, inflight int, n int64) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range inflight {
		wg.Go(func() {
			for next.Add(1) <= n {
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := do(req)
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
	}
	wg.Wait()
}

func report(b *testing.B, n int, elapsed, cpu time.Duration) {
	b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-us/op")
	b.ReportMetric(float64(n)/elapsed.Seconds(), "req/s")
}

// cpuNow is this process's user and system CPU so far.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// counter is a pgx tracer counting round trips and statements, and the
// backends the pools talk to (by process id, for their CPU).
type counter struct {
	trips, stmts atomic.Int64
	// reservation groups: how many, their reservations, their time
	groups, reserved, groupNanos atomic.Int64
	mu                           sync.Mutex
	pids                         map[uint32]bool
}

func (c *counter) reset() {
	c.trips.Store(0)
	c.stmts.Store(0)
	c.groups.Store(0)
	c.reserved.Store(0)
	c.groupNanos.Store(0)
}

type groupStart struct{}

func (c *counter) saw(conn *pgx.Conn) {
	pid := conn.PgConn().PID()
	c.mu.Lock()
	c.pids[pid] = true
	c.mu.Unlock()
}

func (c *counter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.trips.Add(1)
	c.stmts.Add(1)
	c.saw(conn)
	if isReserve(d.SQL) { // a group of one
		c.groups.Add(1)
		c.reserved.Add(1)
		return context.WithValue(ctx, groupStart{}, time.Now())
	}
	return ctx
}

func (c *counter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if t, ok := ctx.Value(groupStart{}).(time.Time); ok {
		c.groupNanos.Add(int64(time.Since(t)))
	}
}

func (c *counter) TraceBatchStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	c.trips.Add(1)
	c.stmts.Add(int64(d.Batch.Len()))
	c.saw(conn)
	if n := reservations(d.Batch); n > 0 {
		c.groups.Add(1)
		c.reserved.Add(int64(n))
		return context.WithValue(ctx, groupStart{}, time.Now())
	}
	return ctx
}

func (c *counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *counter) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	if t, ok := ctx.Value(groupStart{}).(time.Time); ok {
		c.groupNanos.Add(int64(time.Since(t)))
	}
}

// pgCPU is the CPU the backends seen so far used, from /proc/PID/stat
// (utime and stime, in clock ticks of 10 ms); 0 where /proc does not show
// them (PostgreSQL elsewhere).
func (c *counter) pgCPU() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ticks int64
	for pid := range c.pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		k, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + k
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}
