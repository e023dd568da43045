package idemstatus_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemstatus"
)

// TestPageSaysWhatIdemResumeCanDo: an operation journaled without its
// credentials can be resumed by the idem command given them with
// --header-file; the page said "`idem resume` cannot". And the command
// resumes a bbolt journal only while the application is stopped (the
// application holds its lock while the page is up).
func TestPageSaysWhatIdemResumeCanDo(t *testing.T) {
	store := idem.NewMemoryStore()
	defer store.Close()
	fillPending(t, store, 2, 1) // the first journaled without credentials
	for _, h := range []struct {
		name string
		opts []idemstatus.Option
	}{{"plain", nil}, {"with WithResumePrepare", []idemstatus.Option{idemstatus.WithResumePrepare()}}} {
		st := status(t, idemstatus.Handler(store, nil, h.opts...), "/?format=json", nil)
		require.Len(t, st.Pending.Operations, 2, h.name)
		for _, op := range st.Pending.Operations {
			assert.NotContains(t, op.Do, "cannot", "%s: %s: %s", h.name, op.Key, op.Do)
			assert.Contains(t, op.Do, "idem resume", "%s: %s", h.name, op.Key)
			if op.Redacted {
				assert.Contains(t, op.Do, "--header-file", "%s: %s: %s", h.name, op.Key, op.Do)
			}
			assert.Contains(t, op.Do, "stopped", "%s: %s: %s", h.name, op.Key, op.Do)
		}
	}
}
