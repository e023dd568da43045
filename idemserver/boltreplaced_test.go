package idemserver_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

// TestBoltStoreReplacedRunsOnce: a new key's Begin opens no transaction,
// so a file replaced under the running store (renamed over, or
// overwritten in place with an older copy, truncated) is found at the key's
// Complete, after its handler ran. The answer is then withheld, and the
// key must not be handed out again when its lease lapses: its handler
// would run a second time, and the second answer could not be stored
// either.
func TestBoltStoreReplacedRunsOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replace func(t *testing.T, path string, older []byte)
	}{
		{"renamed over", func(t *testing.T, path string, _ []byte) {
			other := path + ".other"
			s, err := idemserver.OpenBoltStore(other, nil)
			require.NoError(t, err)
			require.NoError(t, s.Close())
			require.NoError(t, os.Rename(other, path))
		}},
		{"truncated", func(t *testing.T, path string, _ []byte) {
			require.NoError(t, os.Truncate(path, 0))
		}},
		{"older copy in place", func(t *testing.T, path string, older []byte) {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteAt(older, 0)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys.db")
			s, err := idemserver.OpenBoltStore(path, nil)
			require.NoError(t, err)
			defer s.Close()
			complete(t, s, "a", []byte("ok"))
			older, err := os.ReadFile(path)
			require.NoError(t, err)
			complete(t, s, "b", []byte("ok"))
			tc.replace(t, path, older)

			ctx := context.Background()
			runs := 0
			for i := range 3 {
				// Each attempt comes after the last one's lease lapsed.
				now := t0.Add(time.Duration(i) * 2 * time.Minute)
				c, err := s.Begin(ctx, idemserver.Begin{ID: "new", Fingerprint: "fp", Now: now, LeaseUntil: now.Add(time.Minute)})
				if err != nil || c.State != idemserver.StateAcquired {
					continue
				}
				runs++ // the handler runs
				err = s.Complete(ctx, idemserver.Completion{ID: "new", Token: c.Token, Response: &idemserver.Response{Status: 201}, Now: now, Until: now.Add(time.Hour)})
				require.Error(t, err, "a response stored in a file that is no longer the store's")
			}
			require.Equal(t, 1, runs, "the handler of one key ran %d times", runs)
		})
	}
}
