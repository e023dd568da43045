package readall

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAppend(t *testing.T) {
	tests := []struct {
		name   string
		prefix string
		body   string
		end    int64
		want   string
	}{
		{"whole body", "", "hello", 100, "hello"},
		{"cut at end", "", "hello world", 5, "hello"},
		{"after a prefix", "ab", "cdef", 4, "abcd"},
		{"empty", "", "", 10, ""},
		{"prefix already at end", "abc", "def", 3, "abc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := make([]byte, len(tt.prefix), len(tt.prefix)+1)
			copy(b, tt.prefix)
			got, err := Append(b, iotest.OneByteReader(strings.NewReader(tt.body)), tt.end)
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(got))
		})
	}
}

func TestAppendReadError(t *testing.T) {
	boom := errors.New("boom")
	got, err := Append(nil, io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), 100)
	require.ErrorIs(t, err, boom)
	assert.Equal(t, "abc", string(got), "what was read before the error")
}
