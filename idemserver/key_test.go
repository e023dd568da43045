package idemserver_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

func TestParseKey(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"abc", "abc", true},
		{`"abc"`, "abc", true},
		{" \t8e03978e-40d5-43e8-bc93-6894a57f9324 ", "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{`"a b"`, "a b", true},
		{`"a\"b\\c"`, `a"b\c`, true},
		{strings.Repeat("k", 255), strings.Repeat("k", 255), true},
		{`"` + strings.Repeat("k", 255) + `"`, strings.Repeat("k", 255), true},
		{"", "", false},
		{`""`, "", false},
		{strings.Repeat("k", 256), "", false},
		{`"` + strings.Repeat("k", 256) + `"`, "", false},
		{"a b", "", false},
		{"clé", "", false},
		{"a\x7fb", "", false},
		{`"abc`, "", false},
		{`"ab"c"`, "", false},
		{`"a\nb"`, "", false},
		{`"a\`, "", false},
		{`"a` + "\t" + `b"`, "", false},
		// Structured-field rules: a comma makes a list, parameters on a
		// quoted key are accepted and ignored.
		{"a,b", "", false},
		{"abc,", "", false},
		{`"a", "b"`, "", false},
		{`"a",`, "", false},
		{`"a,b"`, "a,b", true},
		{`"abc";v=1`, "abc", true},
		{`"abc"; v=1;x;y=?0;z="q;\"";t=tok/en:1;b=:AQID:;n=-1.5`, "abc", true},
		{`"abc";`, "", false},
		{`"abc";V=1`, "", false},
		{`"abc";v=`, "", false},
		{`"abc";v=?2`, "", false},
		{`"abc";v=:!!:`, "", false},
		{`"abc" ;v=1`, "", false},
	}
	for _, tt := range tests {
		got, err := idemserver.ParseKey(tt.in)
		if !tt.ok {
			assert.ErrorIs(t, err, idemserver.ErrInvalidKey, "ParseKey(%q)", tt.in)
			continue
		}
		require.NoError(t, err, "ParseKey(%q)", tt.in)
		assert.Equal(t, tt.want, got, "ParseKey(%q)", tt.in)
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\\"`, " x ", `"`, `""`, "é", strings.Repeat("k", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		key, err := idemserver.ParseKey(in)
		if err != nil {
			require.ErrorIs(t, err, idemserver.ErrInvalidKey)
			return
		}
		if len(key) == 0 || len(key) > idemserver.MaxKeyBytes {
			t.Fatalf("ParseKey(%q) = %q: length %d out of range", in, key, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte %#x is not printable ASCII", in, key, key[i])
			}
		}
		// The quoted form of the key parses to the same key.
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		again, err := idemserver.ParseKey(quoted)
		require.NoError(t, err, "ParseKey(%q)", quoted)
		require.Equal(t, key, again)
		// A key without spaces or quotes parses bare to itself.
		if !strings.ContainsAny(key, ` ",`) {
			bare, err := idemserver.ParseKey(key)
			require.NoError(t, err, "ParseKey(%q)", key)
			require.Equal(t, key, bare)
		}
	})
}
