package pgstore_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/pgstore"
)

// oldRows inserts n finished operations whose Updated is before cutoff,
// in one statement, into s's schema, beside one pending row and one
// finished row after cutoff (which no sweep may take).
func oldRows(t *testing.T, s *pgstore.Store, n int, cutoff time.Time) {
	t.Helper()
	ops := pgx.Identifier{s.Schema(), "operations"}.Sanitize()
	old := cutoff.Add(-time.Hour).UnixNano()
	_, err := s.Pool().Exec(testContext(t), `INSERT INTO `+ops+`
		(key, version, method, url, host, fingerprint, state, attempts, last_status, last_error, created, updated, owner, lease_until, redacted, unreplayable, body)
		SELECT 'old-' || lpad(i::text, 8, '0'), 1, 'POST', 'https://psp.example/v1', 'psp.example', '\x'::bytea || decode(repeat('00', 32), 'hex'),
			CASE WHEN i = 0 THEN 1 ELSE 2 END, 1, 201, '', $1::bigint, CASE WHEN i = 1 THEN $2::bigint ELSE $1::bigint END, '', 0, false, false, decode(repeat('ab', 1000), 'hex')
		FROM generate_series(0, $3::int + 1) AS i`, old, cutoff.Add(time.Hour).UnixNano(), n)
	require.NoError(t, err)
}

// oldRowsLeft returns how many rows of s's journal are finished and older
// than cutoff, and how many rows it holds in all.
func oldRowsLeft(t *testing.T, s *pgstore.Store, cutoff time.Time) (old, all int) {
	t.Helper()
	ops := pgx.Identifier{s.Schema(), "operations"}.Sanitize()
	require.NoError(t, s.Pool().QueryRow(testContext(t),
		`SELECT count(*) FILTER (WHERE state <> 1 AND updated < $1), count(*) FROM `+ops, cutoff.UnixNano()).Scan(&old, &all))
	return old, all
}

// TestOverlappingSweeps runs two Sweeps at once, from two replicas, over
// more old rows than one chunk (rows of 1 KB, so that the table is
// larger than a quarter of shared_buffers' default and PostgreSQL's
// synchronized scans start the two sweeps' scans at different places, as
// on a large journal), several rounds: together they delete every
// old row and nothing else, and the counts they report add up to what
// was deleted.
func TestOverlappingSweeps(t *testing.T) {
	ctx := testContext(t)
	cutoff := time.Now()
	const n = 50000
	for round := range 8 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			a := openStore(t) // a fresh table each round: no dead rows of the last
			b := replica(t, a)
			oldRows(t, a, n, cutoff)
			var counts [2]int
			var errs [2]error
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, s := range []*pgstore.Store{a, b} {
				wg.Go(func() {
					<-start
					counts[i], errs[i] = s.Sweep(ctx, cutoff)
				})
			}
			close(start)
			wg.Wait()
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			left, all := oldRowsLeft(t, a, cutoff)
			t.Logf("sweeps reported %d and %d; %d old rows left", counts[0], counts[1], left)
			assert.Zero(t, left, "old rows left after both sweeps returned")
			assert.Equal(t, n, counts[0]+counts[1], "rows the sweeps report deleted")
			assert.Equal(t, 2, all, "rows kept: the pending one and the recent one")
		})
	}
}
