package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHelpCheck: "idem help check" prints check's help, as "idem help
// CMD" does for every other command (it said: unknown command "check").
func TestHelpCheck(t *testing.T) {
	r := runIdem(t, "help", "check")
	assert.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "usage: idem check")
	assert.Contains(t, r.stdout, "--key-header")
}

// TestFlagsAfterArguments: a command's flags may follow its argument, as
// the usage text writes "show KEY|NAME [--body]" (it said: show takes 1
// argument(s), got 2).
func TestFlagsAfterArguments(t *testing.T) {
	j := newJournal(t)
	key := j.keys["pay:lost"]
	for _, args := range [][]string{{"show", "pay:lost", "--body"}, {"show", "--body", "pay:lost"}} {
		r := runIdem(t, append([]string{"--journal", j.path}, args...)...)
		require.Equal(t, exitOK, r.code, "%v: %s", args, r.stderr)
		assert.Contains(t, r.stdout, key, "%v", args)
		assert.Contains(t, r.stdout, "tok_visa", "%v prints the body", args)
	}
	r := runIdem(t, "--journal", j.path, "show", "pay:lost", "pay:ok")
	assert.Equal(t, exitUsage, r.code, "two arguments are still refused")
}

// TestUsageErrorIsOneLine: a usage error says what is wrong and where the
// help is, in one line, instead of printing the whole help after it.
func TestUsageErrorIsOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		see  string
	}{
		{[]string{"--journal", "x.db"}, "see idem help"},
		{[]string{"--journal", "x.db", "frobnicate"}, "see idem help"},
		{[]string{"--journal", "x.db", "show"}, "see idem help show"},
		{[]string{"--journal", "x.db", "gc", "--retention", "-1h"}, "see idem help gc"},
		{[]string{"--journal", "x.db", "resume", "--nope"}, "see idem help resume"},
	} {
		r := runIdem(t, tc.args...)
		assert.Equal(t, exitUsage, r.code, "%v", tc.args)
		assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "%v: one line: %q", tc.args, r.stderr)
		assert.Contains(t, r.stderr, tc.see, "%v", tc.args)
		assert.NotContains(t, r.stderr, "Commands:", "%v", tc.args)
	}
}
