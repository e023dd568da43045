package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/idemgo/idem"
	"github.com/stretchr/testify/require"
)

// TestSharedHeaderSurvivesResumePrepare checks that the journaled header
// keyed requests with the same headers share is changed by nobody: a
// WithResumePrepare hook that changes the values of the header it is
// handed in place, and appends to them, changes only the request it
// prepares, not the journaled header of any operation, resumed or sent
// later with the same headers, in either store.
func TestSharedHeaderSurvivesResumePrepare(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) idem.KeyStore
	}{
		{"memory", func(*testing.T) idem.KeyStore { return idem.NewMemoryStore() }},
		{"bolt", func(t *testing.T) idem.KeyStore { return openBolt(t, filepath.Join(t.TempDir(), "j.db")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := tc.store(t)
				var mu sync.Mutex
				var seen [][]string // X-A as each prepare hook found it
				rt := &scriptRT{steps: []step{fail(errReset)}}
				c := idem.New(store, idem.WithBaseTransport(rt), idem.WithMaxAttempts(1), idem.WithResumeConcurrency(1),
					idem.WithResumePrepare(func(r *http.Request) error {
						mu.Lock()
						seen = append(seen, slices.Clone(r.Header["X-A"]))
						mu.Unlock()
						r.Header["X-A"][0] = "changed"
						r.Header["X-A"] = append(r.Header["X-A"], "appended")
						return nil
					}))
				defer c.Close()
				send := func(i int) {
					req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader(fmt.Sprintf(`{"n":%d}`, i)))
					require.NoError(t, err)
					req.Header["X-A"] = []string{"1", "2"}
					_, err = c.HTTPClient().Do(req)
					require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
				}
				for i := range 4 {
					send(i)
				}
				fn, got := collect()
				require.NoError(t, c.Resume(context.Background(), fn))
				require.Len(t, got.list(), 4)
				for i := 4; i < 6; i++ {
					send(i)
				}
				require.NoError(t, c.Resume(context.Background(), fn))
				mu.Lock()
				defer mu.Unlock()
				require.Len(t, seen, 4+6)
				for i, s := range seen {
					if !slices.Equal(s, []string{"1", "2"}) {
						t.Errorf("prepare hook %d found X-A %q, want the journaled [1 2]", i, s)
					}
				}
				ops, err := store.Pending(context.Background(), "", 0)
				require.NoError(t, err)
				require.Len(t, ops, 6)
				for _, op := range ops {
					if !slices.Equal(op.Header["X-A"], []string{"1", "2"}) {
						t.Errorf("%s journals X-A %q, want [1 2]", op.Key, op.Header["X-A"])
					}
				}
			})
		})
	}
}
