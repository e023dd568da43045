package pgstore_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// BenchmarkOnce measures consumer transactions per second with and without
// Once, side by side in one run: each transaction inserts the consumer's
// effect row and commits; the "once" variant records a new event id with
// Once first. The two alternate in rounds of 64 transactions per worker,
// so that both see the same machine; each reports tx/s and "once/plain",
// the ratio of their rates. It reports; it asserts nothing.
//
//	IDEM_TEST_POSTGRES=postgres://... go test -run '^$' -bench BenchmarkOnce -benchtime 4000x ./pgstore
func BenchmarkOnce(b *testing.B) {
	dsn := pgtest.DSN(b)
	for _, workers := range []int{1, 16} {
		b.Run(fmt.Sprintf("consumers=%d", workers), func(b *testing.B) {
			s, err := pgstore.OpenServerStore(b.Context(), dsn+"&pool_max_conns=32", pgstore.WithSchema(pgtest.Schema(b, dsn)))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			effects := pgx.Identifier{s.Schema(), "effects"}.Sanitize()
			if _, err := s.Pool().Exec(b.Context(), `CREATE TABLE `+effects+` (event text NOT NULL)`); err != nil {
				b.Fatal(err)
			}
			var ids atomic.Int64
			consume := func(ctx context.Context, once bool) error {
				id := strconv.FormatInt(ids.Add(1), 10)
				tx, err := s.Pool().Begin(ctx)
				if err != nil {
					return err
				}
				defer tx.Rollback(ctx)
				if once {
					if first, err := s.Once(ctx, tx, "bench", id); err != nil || !first {
						return fmt.Errorf("once %s: first=%v: %v", id, first, err)
					}
				}
				if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` (event) VALUES ($1)`, id); err != nil {
					return err
				}
				return tx.Commit(ctx)
			}
			const round = 64
			var spent [2]atomic.Int64 // nanoseconds of plain, once
			var done [2]atomic.Int64
			per := max(b.N/workers/2, 1)
			b.ResetTimer()
			var wg sync.WaitGroup
			for range workers {
				wg.Go(func() {
					for n := 0; n < per; n += round {
						for v := range 2 {
							k := min(round, per-n)
							start := time.Now()
							for range k {
								if err := consume(b.Context(), v == 1); err != nil {
									b.Error(err)
									return
								}
							}
							spent[v].Add(int64(time.Since(start)))
							done[v].Add(int64(k))
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			rate := func(v int) float64 {
				return float64(done[v].Load()) / (time.Duration(spent[v].Load()) / time.Duration(workers)).Seconds()
			}
			b.ReportMetric(rate(0), "plain-tx/s")
			b.ReportMetric(rate(1), "once-tx/s")
			b.ReportMetric(rate(1)/rate(0), "once/plain")
		})
	}
}
