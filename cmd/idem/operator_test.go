package main

// An operator runs the command against the journal between crashes of the
// application: exactly once must still hold.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/internal/crashtest"
)

func init() { crashChildren["app"] = childApp }

const appHeader = "Paypal-Request-Id" // the application's key header

func appName(i int) string { return "order-" + strconv.Itoa(i) }
func appBody(i int) string { return fmt.Sprintf(`{"order":%q,"amount":%d}`, appName(i), 1000+i) }

// childApp is one life of the application: it resumes what is pending,
// then drives every operation the journal does not record as succeeded,
// by name, emitting "done <i>" for each answer it received; "complete"
// after a clean Close.
func childApp() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, _ := strconv.Atoi(os.Getenv("IDEM_APP_OPS"))
	c, err := idem.Open(os.Getenv("IDEM_JOURNAL"), idem.WithKeyHeader(appHeader),
		idem.WithResendWindow(47*time.Hour), idem.WithMaxAttempts(3),
		idem.WithBackoff(time.Millisecond, 5*time.Millisecond),
		idem.WithBaseTransport(&http.Transport{DisableKeepAlives: true}))
	if err != nil {
		crashtest.Emit("fatal", strings.ReplaceAll(err.Error(), "\n", " "))
		return 2
	}
	_ = c.Resume(ctx, func(op idem.Operation, r *http.Response, err error) {
		if r != nil {
			_, _ = io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
	})
	url := os.Getenv("IDEM_APP_URL")
	for i := range n {
		for try := 0; try < 5; try++ {
			req, _ := http.NewRequestWithContext(idem.WithOperation(ctx, appName(i)), http.MethodPost, url, strings.NewReader(appBody(i)))
			req.Header.Set("Content-Type", "application/json")
			r, err := c.HTTPClient().Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, r.Body)
				r.Body.Close()
				if r.StatusCode < 300 {
					crashtest.Emit("done", strconv.Itoa(i))
					break
				}
			}
		}
	}
	if err := c.Close(); err != nil {
		crashtest.Emit("fatal", strings.ReplaceAll(err.Error(), "\n", " "))
		return 2
	}
	crashtest.Emit("complete")
	return 0
}

func TestOperatorBetweenKills(t *testing.T) {
	const ops, kills = 60, 4
	seed := rand.Uint64()
	srv := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}), idemtest.WithKeyHeader(appHeader), idemtest.WithRequireKey(),
		idemtest.WithFaultRates(idemtest.FaultRates{Seed: seed, DropBefore: 0.05, DropAfter: 0.1, Unavailable: 0.05}))
	defer srv.Close()
	journal := filepath.Join(t.TempDir(), "journal.db")
	env := []string{"IDEM_JOURNAL=" + journal, "IDEM_APP_URL=" + srv.URL + "/v1/orders", "IDEM_APP_OPS=" + strconv.Itoa(ops)}
	rng := rand.New(rand.NewPCG(seed, 1))

	operator := func(round int) {
		for _, args := range [][]string{{"pending"}, {"stats"}, {"ls"}} {
			r := runIdem(t, append([]string{"--journal", journal, "--json"}, args...)...)
			require.Equal(t, exitOK, r.code, "round %d: idem %v: %s", round, args, r.stderr)
			require.True(t, json.Valid([]byte(r.stdout)), "round %d: idem %v printed %q", round, args, r.stdout)
		}
		if round%2 == 1 { // sometimes the operator resumes too
			r := runIdem(t, "--journal", journal, "resume")
			require.Contains(t, []int{exitOK, exitFailed}, r.code, "round %d: resume: %s", round, r.stderr)
			require.NotContains(t, r.stdout+r.stderr, "panic")
		}
	}

	complete := false
	for round := 0; round < kills+3 && !complete; round++ {
		child := crashtest.Start(t, "app", env...)
		var lines []string
		if round < kills {
			lines = child.KillAfter(1 + rng.IntN(ops/kills))
		} else {
			var err error
			lines, err = child.Wait()
			require.NoError(t, err, "%v", lines)
		}
		for _, l := range lines {
			if strings.HasPrefix(l, "fatal") {
				t.Fatalf("round %d: %s", round, l)
			}
			complete = complete || l == "complete"
		}
		operator(round)
	}
	require.True(t, complete, "no application run completed")

	st := srv.Stats()
	s, err := idem.OpenBoltStore(journal, nil)
	require.NoError(t, err)
	defer s.Close()
	duplicates, lost := st.DuplicateKeys(), 0
	for i := range ops {
		switch runs := st.RunsByPayload[idemtest.Fingerprint(http.MethodPost, "/v1/orders", []byte(appBody(i)))]; {
		case runs == 0:
			lost++
		case runs > 1:
			duplicates++
		}
		op, err := s.Named(context.Background(), appName(i))
		require.NoError(t, err, appName(i))
		assert.Equal(t, idem.StateSucceeded, op.State, appName(i))
		assert.Equal(t, 1, st.RunsByKey[op.Key], "%s performed once under its journaled key", appName(i))
	}
	t.Logf("seed %d: %d requests, %d handler runs, faults %v; %d duplicates, %d lost", seed, st.Requests, st.Runs, st.Faults, duplicates, lost)
	assert.Zero(t, duplicates, "duplicates")
	assert.Zero(t, lost, "lost")
}
