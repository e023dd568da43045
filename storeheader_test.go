package idem_test

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// TestStorePrivateHeaderValues: a caller who edits a header value in place
// after its call was left in doubt does not change what the journal holds
// (and Resume sends) under the key.
func TestStorePrivateHeaderValues(t *testing.T) {
	store := idem.NewMemoryStore()
	rt := &scriptRT{steps: []step{fail(errReset)}}
	c := idem.New(store, idem.WithBaseTransport(rt), idem.WithMaxAttempts(1))
	defer c.Close()
	var keys []string
	for i := range 3 { // a miss, a miss twice (the shared header), a hit
		req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader(`{"amount":`+strconv.Itoa(i)+`}`))
		require.NoError(t, err)
		req.Header["X-Group"] = []string{"a"}
		_, err = c.HTTPClient().Do(req)
		require.Error(t, err, "attempt %d", i)
		req.Header["X-Group"][0] = "b"
		keys = append(keys, rt.sent[i].key)
	}
	require.Len(t, slices.Compact(slices.Clone(keys)), 3, "three operations")
	for _, k := range keys {
		op, err := store.Get(t.Context(), k)
		require.NoError(t, err)
		assert.Equal(t, []string{"a"}, op.Header["X-Group"], "the journal keeps what was sent")
	}
}
