package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/crashtest"
)

// crashChildren are the helper modes a test runs this binary in (see
// internal/crashtest).
var crashChildren = map[string]func() int{}

func TestMain(m *testing.M) {
	if child, ok := crashChildren[crashtest.Mode()]; ok {
		os.Exit(child())
	}
	if os.Getenv(envDSN) == "" && os.Getenv("CI") != "true" {
		fmt.Fprintf(os.Stderr, "cmd/idem: PostgreSQL tests skipped: set %s=postgres://user:pass@127.0.0.1:5432/db to run them\n", envDSN)
	}
	goleak.VerifyTestMain(m)
}

// provider answers /ok with 201 and cuts the connection on /lost until
// healed is set; then /lost answers 201 too.
type provider struct {
	*httptest.Server
	healed atomic.Bool
	auth   atomic.Int64 // requests that carried an Authorization header
	forged atomic.Int64 // requests whose key was "not-the-key"
}

func newProvider(t *testing.T) *provider {
	t.Helper()
	p := &provider{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("Authorization") != "" {
			p.auth.Add(1)
		}
		if r.Header.Get("Idempotency-Key") == "not-the-key" {
			p.forged.Add(1)
		}
		if r.URL.Path == "/lost" && !p.healed.Load() {
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ch_1"}`)
	}))
	t.Cleanup(p.Close)
	return p
}

// journal is a journal made by a real Client: "pay:ok" succeeded,
// "pay:lost" and "pay:secret" (sent with credentials) are in doubt.
type journal struct {
	path string
	p    *provider
	keys map[string]string // name -> key
}

const secretAuth = "Bearer sk_live_do_not_print"

func newJournal(t *testing.T) *journal {
	t.Helper()
	j := &journal{path: filepath.Join(t.TempDir(), "journal.db"), p: newProvider(t), keys: map[string]string{}}
	c, err := idem.Open(j.path,
		idem.WithMaxAttempts(2),
		idem.WithBackoff(time.Millisecond, time.Millisecond),
		idem.WithBaseTransport(&http.Transport{DisableKeepAlives: true}))
	require.NoError(t, err)
	for _, tc := range []struct{ name, path, auth string }{
		{"pay:ok", "/ok", ""},
		{"pay:lost", "/lost", ""},
		{"pay:secret", "/lost", secretAuth},
	} {
		ctx := idem.WithOperation(context.Background(), tc.name)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.p.URL+tc.path, strings.NewReader(`{"amount":4200,"card":"tok_visa"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := c.HTTPClient().Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	require.NoError(t, c.Close())
	store, err := idem.OpenBoltStore(j.path, nil)
	require.NoError(t, err)
	for _, name := range []string{"pay:ok", "pay:lost", "pay:secret"} {
		op, err := store.Named(context.Background(), name)
		require.NoError(t, err)
		j.keys[name] = op.Key
	}
	require.NoError(t, store.Close())
	return j
}

// result is one run of the command.
type result struct {
	code           int
	stdout, stderr string
}

func runIdem(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

// runJSON runs the command with --json, wants success, and decodes its
// output into v.
func runJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	r := runIdem(t, append([]string{"--json"}, args...)...)
	require.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), v), r.stdout)
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "no command"},
		{[]string{"--journal", "x", "frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"ls"}, exitUsage, "no journal"},
		{[]string{"--journal", "x", "show"}, exitUsage, "show takes 1 argument"},
		{[]string{"--journal", "x", "gc", "--retention", "soon"}, exitUsage, "invalid value"},
		// A negative duration or count was taken for the default (gc
		// swept under the journal's retention) instead of refused.
		{[]string{"--journal", "x", "gc", "--retention", "-5h"}, exitUsage, "--retention must not be negative"},
		{[]string{"--journal", "x", "resume", "--resend-window", "-1s"}, exitUsage, "--resend-window must not be negative"},
		{[]string{"--journal", "x", "resume", "--concurrency", "-1"}, exitUsage, "--concurrency must not be negative"},
		{[]string{"--journal", "x", "--lock-timeout", "-1s", "ls"}, exitUsage, "--lock-timeout must not be negative"},
		{[]string{"--journal", filepath.Join(t.TempDir(), "none.db"), "ls"}, exitFailed, "no journal at"},
	} {
		r := runIdem(t, tc.args...)
		assert.Equal(t, tc.code, r.code, "%v", tc.args)
		assert.Contains(t, r.stderr, tc.want, "%v", tc.args)
	}
	r := runIdem(t, "-h")
	assert.Equal(t, exitOK, r.code)
	assert.Contains(t, r.stdout, "usage: idem")
	r = runIdem(t, "help")
	assert.Equal(t, exitOK, r.code)
	assert.Contains(t, r.stdout, "usage: idem")
	for _, args := range [][]string{{"help", "gc"}, {"gc", "--help"}} {
		r = runIdem(t, args...)
		assert.Equal(t, exitOK, r.code, "%v", args)
		assert.Contains(t, r.stdout, "  --retention duration", "%v: two-dash flags", args)
		assert.Contains(t, r.stdout, "  --dry-run", "%v", args)
	}
}

func TestAgeIsRounded(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{1500 * time.Millisecond, "2s"},
		{16*time.Minute + 20*time.Second, "16m"},
		{2*time.Hour + 3*time.Minute + 10*time.Second, "2h3m"},
		{3*24*time.Hour + 4*time.Hour + 20*time.Minute, "3d4h"},
	} {
		assert.Equal(t, tc.want, age(tc.d.Seconds()), "%s", tc.d)
	}
}

func TestCommandsNeverCreateAJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none.db")
	for _, cmd := range []string{"ls", "pending", "stats", "verify", "gc", "resume"} {
		r := runIdem(t, "--journal", path, cmd)
		assert.Equal(t, exitFailed, r.code, cmd)
		assert.NoFileExists(t, path, cmd)
	}
}

func TestLsAndPending(t *testing.T) {
	j := newJournal(t)
	for _, cmd := range []string{"ls", "pending"} {
		t.Run(cmd, func(t *testing.T) {
			var l listing
			runJSON(t, &l, "--journal", j.path, cmd)
			byName := map[string]opView{}
			for _, v := range l.Operations {
				byName[v.Name] = v
			}
			if cmd == "ls" {
				// ls lists finished operations too.
				require.Len(t, byName, 3, "every operation: %+v", l.Operations)
				assert.Equal(t, "succeeded", byName["pay:ok"].State)
				assert.Nil(t, byName["pay:ok"].Body)
				delete(byName, "pay:ok")
			}
			require.Len(t, byName, 2, "the pending operations: %+v", l.Operations)
			lost := byName["pay:lost"]
			assert.Equal(t, j.keys["pay:lost"], lost.Key)
			assert.Equal(t, "pending", lost.State)
			assert.Equal(t, http.MethodPost, lost.Method)
			assert.Equal(t, j.p.URL+"/lost", lost.URL)
			assert.Equal(t, 2, lost.Attempts)
			assert.Equal(t, "yes", lost.Resend)
			assert.Nil(t, lost.Body)
			assert.Nil(t, lost.Header)
			assert.Equal(t, "needs credentials", byName["pay:secret"].Resend)
			assert.True(t, byName["pay:secret"].Redacted)
			assert.Zero(t, l.Unreadable)

			r := runIdem(t, "--journal", j.path, cmd)
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Contains(t, r.stdout, "KEY")
			assert.Contains(t, r.stdout, j.keys["pay:lost"])
			if cmd == "ls" {
				assert.Contains(t, r.stdout, j.keys["pay:ok"])
				assert.Contains(t, r.stdout, "3 operations, 2 pending")
			} else {
				assert.NotContains(t, r.stdout, j.keys["pay:ok"])
				assert.Contains(t, r.stdout, "2 pending")
			}
			assert.NotContains(t, r.stdout, "tok_visa", "no bodies")
			assert.NotContains(t, r.stdout, "sk_live", "no secrets")
		})
	}
}

func TestShow(t *testing.T) {
	j := newJournal(t)
	t.Run("by name, finished", func(t *testing.T) {
		var v opView
		runJSON(t, &v, "--journal", j.path, "show", "pay:ok")
		assert.Equal(t, j.keys["pay:ok"], v.Key)
		assert.Equal(t, "succeeded", v.State)
		assert.Equal(t, http.StatusCreated, v.LastStatus)
		assert.Len(t, v.Fingerprint, 64)
		assert.Empty(t, v.Resend)
	})
	t.Run("by key, without body", func(t *testing.T) {
		var v opView
		runJSON(t, &v, "--journal", j.path, "show", j.keys["pay:secret"])
		assert.Equal(t, "pay:secret", v.Name)
		assert.Equal(t, []string{"Content-Type"}, v.HeaderNames, "credentials are not journaled")
		assert.Nil(t, v.Header)
		assert.Nil(t, v.Body)
		r := runIdem(t, "--journal", j.path, "show", j.keys["pay:secret"])
		require.Equal(t, exitOK, r.code, r.stderr)
		assert.Contains(t, r.stdout, "needs credentials")
		assert.NotContains(t, r.stdout, "tok_visa")
	})
	t.Run("with body", func(t *testing.T) {
		var v opView
		runJSON(t, &v, "--journal", j.path, "show", "--body", "pay:secret")
		require.NotNil(t, v.Body)
		assert.JSONEq(t, `{"amount":4200,"card":"tok_visa"}`, *v.Body)
		assert.Equal(t, "application/json", v.Header.Get("Content-Type"))
		assert.Empty(t, v.Header.Get("Authorization"))
		r := runIdem(t, "--journal", j.path, "show", "--body", "pay:secret")
		require.Equal(t, exitOK, r.code, r.stderr)
		assert.Contains(t, r.stdout, "tok_visa")
		assert.NotContains(t, r.stdout, "sk_live")
	})
	t.Run("unknown", func(t *testing.T) {
		r := runIdem(t, "--journal", j.path, "show", "pay:nothing")
		assert.Equal(t, exitFailed, r.code)
		assert.Contains(t, r.stderr, `no operation with key or name "pay:nothing"`)
	})
}

func TestStats(t *testing.T) {
	j := newJournal(t)
	var st statsView
	runJSON(t, &st, "--journal", j.path, "stats")
	fi, err := os.Stat(j.path)
	require.NoError(t, err)
	assert.Equal(t, fi.Size(), st.FileSize)
	assert.Equal(t, map[string]int{"pending": 2, "succeeded": 1}, st.ByState)
	require.NotNil(t, st.OldestPending)
	assert.Greater(t, st.OldestPendingAge, 0.0)
	assert.Equal(t, 1, st.NeedCredentials)
	assert.Zero(t, st.PastResendWindow)
	assert.Zero(t, st.Unreadable)

	r := runIdem(t, "--journal", j.path, "stats")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "oldest pending")
}

func TestExpire(t *testing.T) {
	j := newJournal(t)
	var got map[string]string
	runJSON(t, &got, "--journal", j.path, "expire", "pay:lost")
	assert.Equal(t, map[string]string{"key": j.keys["pay:lost"], "name": "pay:lost", "state": "expired"}, got)

	var v opView
	runJSON(t, &v, "--journal", j.path, "show", "pay:lost")
	assert.Equal(t, "expired", v.State)
	assert.Equal(t, "expired by operator", v.LastError)
	var l listing
	runJSON(t, &l, "--journal", j.path, "pending")
	require.Len(t, l.Operations, 1)
	assert.Equal(t, "pay:secret", l.Operations[0].Name)

	for _, arg := range []string{"pay:lost", "pay:ok"} {
		r := runIdem(t, "--journal", j.path, "expire", arg)
		assert.Equal(t, exitFailed, r.code, arg)
		assert.Contains(t, r.stderr, "not pending", arg)
	}
}

func TestGC(t *testing.T) {
	j := newJournal(t)
	var got struct{ Swept int }
	runJSON(t, &got, "--journal", j.path, "gc")
	assert.Zero(t, got.Swept, "the journal's retention keeps a fresh operation")

	// Below the floor (the 23 h resend window plus an hour) is refused.
	r := runIdem(t, "--journal", j.path, "gc", "--retention", "0s")
	assert.Equal(t, exitUsage, r.code, r.stderr)
	assert.Contains(t, r.stderr, "below the journal's floor of 24h0m0s")
	runJSON(t, &got, "--journal", j.path, "gc", "--retention", "24h")
	assert.Zero(t, got.Swept)
	var v opView
	runJSON(t, &v, "--journal", j.path, "show", "pay:ok")
	assert.Equal(t, j.keys["pay:ok"], v.Key, "the named operation keeps its key")
}

func TestResume(t *testing.T) {
	j := newJournal(t)
	j.p.healed.Store(true)
	j.p.auth.Store(0)
	var got struct {
		Operations []resumeResult
		Summary    resumeSummary
	}
	runJSON(t, &got, "--journal", j.path, "resume")
	byName := map[string]resumeResult{}
	for _, r := range got.Operations {
		byName[r.Name] = r
	}
	require.Len(t, byName, 2, "%+v", got.Operations)
	assert.Equal(t, resumeResult{Key: j.keys["pay:lost"], Name: "pay:lost", State: "succeeded", Status: 201, Outcome: "succeeded", Sent: true}, byName["pay:lost"])
	secret := byName["pay:secret"]
	assert.Equal(t, "needs credentials", secret.Outcome)
	assert.Equal(t, "pending", secret.State)
	assert.False(t, secret.Sent)
	assert.Zero(t, j.p.auth.Load(), "the command has no credentials to send")
	assert.Equal(t, resumeSummary{Sent: 1, Succeeded: 1, Skipped: 1}, got.Summary)

	var l listing
	runJSON(t, &l, "--journal", j.path, "pending")
	require.Len(t, l.Operations, 1)
	assert.Equal(t, "pay:secret", l.Operations[0].Name)

	r := runIdem(t, "--journal", j.path, "resume")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "needs credentials")
	assert.Contains(t, r.stdout, "1 pending: 0 sent, 0 succeeded, 0 failed, 1 skipped, 0 expired.")
	assert.Contains(t, r.stdout, "--header-file")

	// Credentials from a file, the secret itself from the environment.
	t.Setenv("IDEM_TEST_TOKEN", secretAuth)
	hf := filepath.Join(t.TempDir(), "headers")
	require.NoError(t, os.WriteFile(hf, []byte("# for the provider\n[127.0.0.1] Authorization: ${IDEM_TEST_TOKEN}\n"+
		"Idempotency-Key: not-the-key\n"), 0o600)) // a key header in the file is never sent
	r = runIdem(t, "--journal", j.path, "resume", "--header-file", hf)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "1 pending: 1 sent, 1 succeeded, 0 failed, 0 skipped, 0 expired.")
	assert.Equal(t, int64(1), j.p.auth.Load(), "the resend carried the credentials")
	assert.Zero(t, j.p.forged.Load(), "the key is never replaced by the header file")
	assert.NotContains(t, r.stdout+r.stderr, "sk_live", "credentials are never printed")
	runJSON(t, &l, "--journal", j.path, "pending")
	assert.Empty(t, l.Operations)
	store, err := idem.OpenBoltStore(j.path, nil)
	require.NoError(t, err)
	op, err := store.Get(context.Background(), j.keys["pay:secret"])
	require.NoError(t, err)
	require.NoError(t, store.Close())
	assert.Nil(t, op.Header["Authorization"], "credentials are never journaled")
}

func TestResumeFailuresExitOne(t *testing.T) {
	j := newJournal(t) // the provider still cuts /lost
	r := runIdem(t, "--journal", j.path, "resume")
	assert.Equal(t, exitFailed, r.code, r.stdout)
	assert.Contains(t, r.stdout, "2 pending: 1 sent, 0 succeeded, 1 failed, 1 skipped, 0 expired.")
	assert.NotContains(t, r.stdout, "resumed.")
}

func TestResumeHeaderFileErrors(t *testing.T) {
	j := newJournal(t)
	dir := t.TempDir()
	for name, content := range map[string]string{
		"not a header": "Authorization sk_live_do_not_print\n",
		"missing env":  "Authorization: Bearer ${IDEM_TEST_UNSET_VAR}\n",
		"empty":        "# nothing\n",
	} {
		hf := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		require.NoError(t, os.WriteFile(hf, []byte(content), 0o600))
		r := runIdem(t, "--journal", j.path, "resume", "--header-file", hf)
		assert.Equal(t, exitUsage, r.code, name)
		assert.Contains(t, r.stderr, "--header-file", name)
		assert.NotContains(t, r.stderr, "sk_live", "%s: a value is never printed", name)
	}
}

func TestLockedJournal(t *testing.T) {
	j := newJournal(t)
	store, err := idem.OpenBoltStore(j.path, nil) // the running application
	require.NoError(t, err)
	defer store.Close()
	for _, cmd := range []string{"ls", "stats", "verify", "expire"} {
		args := []string{"--journal", j.path, "--lock-timeout", "50ms", cmd}
		if cmd == "expire" {
			args = append(args, "pay:lost")
		}
		r := runIdem(t, args...)
		assert.Equal(t, exitLocked, r.code, cmd)
		assert.Contains(t, r.stderr, "in use by a running application", cmd)
		assert.Contains(t, r.stderr, "live", cmd)
		assert.Contains(t, r.stderr, "idemstatus.Handler", cmd)
	}
}

func TestVerify(t *testing.T) {
	t.Run("sound", func(t *testing.T) {
		j := newJournal(t)
		var v verifyView
		runJSON(t, &v, "--journal", j.path, "verify")
		assert.True(t, v.OK, "%v", v.Problems)
		assert.Equal(t, 2, v.Pending)
		assert.Empty(t, v.Problems)
		r := runIdem(t, "--journal", j.path, "verify")
		assert.Equal(t, exitOK, r.code, r.stderr)
		assert.Contains(t, r.stdout, "ok: ")
	})

	pageSize := os.Getpagesize()
	for name, damage := range map[string]func(t *testing.T, path string){
		"empty file": func(t *testing.T, path string) { require.NoError(t, os.Truncate(path, 0)) },
		"truncated": func(t *testing.T, path string) {
			fi, err := os.Stat(path)
			require.NoError(t, err)
			require.Greater(t, fi.Size(), int64(3*pageSize))
			require.NoError(t, os.Truncate(path, int64(3*pageSize)))
		},
		"meta pages overwritten": func(t *testing.T, path string) {
			overwrite(t, path, 0, bytes.Repeat([]byte{0xA5}, 2*pageSize))
		},
		"data pages zeroed": func(t *testing.T, path string) {
			fi, err := os.Stat(path)
			require.NoError(t, err)
			overwrite(t, path, int64(2*pageSize), make([]byte, fi.Size()-int64(2*pageSize)))
		},
		"not a journal": func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, []byte("hello, I am a text file\n"), 0o600))
		},
	} {
		t.Run(name, func(t *testing.T) {
			j := newJournal(t)
			damage(t, j.path)
			r := runIdem(t, "--journal", j.path, "verify")
			assert.Equal(t, exitFailed, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
			assert.Contains(t, r.stdout, "damage: ")
			assert.Contains(t, r.stderr, "is damaged")

			r = runIdem(t, "--journal", j.path, "--json", "verify")
			assert.Equal(t, exitFailed, r.code)
			var v verifyView
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &v), r.stdout)
			assert.False(t, v.OK)
			assert.NotEmpty(t, v.Problems)

			r = runIdem(t, "--journal", j.path, "ls")
			assert.Equal(t, exitFailed, r.code, "ls on a damaged journal: %s", r.stdout)
		})
	}
}

// overwrite writes b into the file at path at offset off.
func overwrite(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(b, off)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// TestREADMEShowsTheHelp: the README's copy of the command list is the
// one the command prints (it had drifted: other wording for resume, expire
// and help).
func TestREADMEShowsTheHelp(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	commands := func(s string) string {
		_, after, ok := strings.Cut(s, "\nCommands:\n")
		require.True(t, ok, "no command list")
		list, _, _ := strings.Cut(after, "\n\n")
		list, _, _ = strings.Cut(list, "\n```")
		return list
	}
	_, block, ok := strings.Cut(string(readme), "```\nusage: idem ")
	require.True(t, ok, "README has no usage block")
	assert.Equal(t, commands(usageText), commands(block))
}
