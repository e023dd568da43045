package idem_test

// The journal's error contract when the disk fails under it: strace makes
// the Nth fdatasync (or pwrite64) of a real child process return EIO or
// ENOSPC while the child makes keyed POSTs against its loopback server.

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/crashstate"
)

// injectedRun records the workload w with inject and checks the error
// contract and every crash state of the run. It returns whether the
// injection fired.
func injectedRun(t *testing.T, c *clientChecker, w string, inject string) (fired bool, unknown int) {
	t.Helper()
	root, ops, lines := recordClient(t, []string{w}, inject)
	wl := splitWorkloads(root, ops)
	if len(wl) != 1 {
		t.Fatalf("%s: %d workloads recorded", inject, len(wl))
	}
	failedAt := -1
	sentBefore := map[string]bool{}
	for _, op := range wl[0].ops {
		if op.Injected {
			fired = true
			// After a failed fsync, or an I/O error, nothing new is sent
			// until the journal is reopened; a full disk is only a
			// failed commit.
			if failedAt < 0 && (op.Kind != crashstate.Write || op.Errno != "ENOSPC") {
				failedAt = op.Seq
			}
		}
		if op.Kind == crashstate.Mark && strings.HasPrefix(string(op.Data), "@crashtest reopened ") {
			failedAt = -1 // reopened: the journal may be used again
		}
		if op.Kind != crashstate.Send {
			continue
		}
		r, ok := parseSend(op.Data)
		if !ok {
			continue
		}
		// After a failed fsync or write the journal refuses new work
		// until it is reopened: no new key leaves.
		if failedAt >= 0 && !sentBefore[r.key] {
			t.Errorf("%s: key %s (%s) sent at %s, after the journal's failed %s", inject, r.key, r.body, op, wl[0].ops[failedAt])
		}
		sentBefore[r.key] = true
	}
	// The final state: what the next process opens.
	s, err := idem.OpenBoltStore(filepath.Join(wl[0].root, "journal.db"), nil)
	if err != nil {
		t.Fatalf("%s: reopen: %v", inject, err)
	}
	defer s.Close()
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 5 || f[0] != "err" || !strings.HasPrefix(f[2], "post:") {
			continue
		}
		name, kind, key := strings.TrimPrefix(f[2], "post:"), f[3], f[4]
		switch {
		case kind == "notsent" && key == "-":
			// "Not sent, no key journaled": the caller retries as told,
			// with a new key. The operation must not be in the journal,
			// or the next process's Resume sends it too.
			if op, err := s.Named(t.Context(), name); err == nil {
				t.Errorf("%s: %s: the caller was told %q, but the reopened journal holds %s (%s): Resume would send it, a retry charges twice",
					inject, name, strings.ReplaceAll(f[len(f)-1], "_", " "), op.Key, op.State)
			}
			for k, b := range sentBody(wl[0].ops) {
				if opName(b) == name {
					t.Errorf("%s: %s: told not sent, but key %s left on the socket", inject, name, k)
				}
			}
		case kind == "unknown" && key == "-":
			t.Errorf("%s: %s: outcome unknown without the key that may be journaled", inject, name)
		case kind == "unknown":
			unknown++
		}
	}
	if _, err := c.check(wl[0]); err != nil {
		t.Errorf("%s: %v", inject, err)
	}
	return fired, unknown
}

// calls counts the fdatasyncs and pwrite64s of the journal in a clean
// recording of w: the injections go over each of them.
func calls(t *testing.T, w string) (syncs, writes int) {
	_, ops, _ := recordClient(t, []string{w})
	for _, op := range ops {
		switch {
		case op.Kind == crashstate.Sync && strings.HasPrefix(filepath.Base(op.Path), "journal.db"):
			syncs++
		case op.Kind == crashstate.Write && strings.HasPrefix(filepath.Base(op.Path), "journal.db"):
			writes++
		}
	}
	return syncs, writes
}

func sentBody(ops []crashstate.Op) map[string]string {
	out := map[string]string{}
	for _, op := range ops {
		if op.Kind == crashstate.Send {
			if r, ok := parseSend(op.Data); ok {
				out[r.key] = r.body
			}
		}
	}
	return out
}

// faultWorkload is the workload the faults are injected into: keyed
// POSTs (every third answer lost, so pending), a Resume, a reopen with
// compaction, more POSTs.
const faultWorkload = "PPPRCPP"

// failEach runs faultWorkload once for each of the first n calls of
// syscall, failing that call with EIO, then again with ENOSPC, and checks
// each run (injectedRun). It returns how many runs the injection fired in
// and how many calls were told outcome unknown; no run firing fails t.
func failEach(t *testing.T, c *clientChecker, syscall string, n int) (fired, unknown int) {
	t.Helper()
	for _, errno := range []string{"EIO", "ENOSPC"} {
		for i := 1; i <= n; i++ {
			f, u := injectedRun(t, c, faultWorkload, fmt.Sprintf("%s:error=%s:when=%d", syscall, errno, i))
			if f {
				fired++
			}
			unknown += u
		}
	}
	if fired == 0 {
		t.Fatal("no injection fired")
	}
	return fired, unknown
}

// TestJournalFailedFdatasync: the Nth fdatasync of the journal fails with
// EIO (then ENOSPC) during a run of keyed POSTs. A caller is told "no key
// journaled" only when the reservation cannot be in the file; after a
// failed fsync nothing new is sent; every crash state of the run keeps
// every key sent.
func TestJournalFailedFdatasync(t *testing.T) {
	crashstate.Need(t)
	c := newClientChecker(t)
	syncs, _ := calls(t, faultWorkload)
	fired, unknown := failEach(t, c, "fdatasync", syncs)
	if unknown == 0 {
		t.Error("no failed fdatasync was reported as outcome unknown: the meta page's fdatasync was never hit")
	}
	t.Logf("%d runs with a failed fdatasync, %d calls told outcome unknown with their key; %d crash states checked", fired, unknown, c.states)
}

// TestJournalFailedWrite: the same with the Nth pwrite64 failing.
func TestJournalFailedWrite(t *testing.T) {
	crashstate.Need(t)
	c := newClientChecker(t)
	_, writes := calls(t, faultWorkload)
	fired, unknown := failEach(t, c, "pwrite64", writes)
	t.Logf("%d runs with a failed pwrite64, %d calls told outcome unknown; %d crash states checked", fired, unknown, c.states)
}

// TestJournalDirectorySyncedBeforeFirstSend: the journal's directory is
// fsynced after the file is created and before the first key leaves on
// the socket: without it a power loss may take the file's name, and with
// it every key sent.
func TestJournalDirectorySyncedBeforeFirstSend(t *testing.T) {
	crashstate.Need(t)
	root, ops, _ := recordClient(t, []string{"P"})
	wl := splitWorkloads(root, ops)
	created, synced := -1, -1
	for _, op := range wl[0].ops {
		switch {
		case (op.Kind == crashstate.Create || op.Kind == crashstate.Link || op.Kind == crashstate.Rename) && filepath.Base(op.Path) == "journal.db" && created < 0:
			created = op.Seq
		case op.Kind == crashstate.DirSync && op.Path == wl[0].root && created >= 0 && synced < 0 && op.Errno == "":
			synced = op.Seq
		case op.Kind == crashstate.Send:
			if created < 0 || synced < 0 {
				t.Fatalf("a key left at %s before the journal's directory was fsynced after its creation (%d)", op, created)
			}
			return
		}
	}
	t.Fatal("no request was sent")
}

// TestJournalFailedFsync: the same with the Nth fsync failing. The
// journal's fsyncs are of its directory (after the file is created, and
// after a compaction's rename at Open) and bbolt's, when it grows the
// file. A directory fsync that failed leaves the name's change not
// durable: a compaction whose rename is not durable must not be used,
// or a power loss brings back the old file without the keys sent since.
func TestJournalFailedFsync(t *testing.T) {
	crashstate.Need(t)
	c := newClientChecker(t)
	_, ops, _ := recordClient(t, []string{faultWorkload})
	n := 0
	for _, op := range ops {
		if op.Kind == crashstate.DirSync || op.Kind == crashstate.Sync {
			n++ // an upper bound on the fsyncs: Sync counts fdatasyncs too
		}
	}
	fired, unknown := failEach(t, c, "fsync", n)
	t.Logf("%d runs with a failed fsync, %d calls told outcome unknown; %d crash states checked", fired, unknown, c.states)
}
