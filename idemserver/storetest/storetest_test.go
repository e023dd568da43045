package storetest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/idemserver/storetest"
)

// Broken stores: each wraps a MemoryStore and gets one rule wrong. The
// suite must fail every one of them, in the subtest named.
type (
	// completeIgnoresLease stores a fenced handler's answer.
	completeIgnoresLease struct{ idemserver.Store }
	// renewIgnoresLease revives a lapsed lease.
	renewIgnoresLease struct{ idemserver.Store }
	// dropsNotKept stores a "not kept" record as an empty response, which
	// a replay would send as the handler's answer.
	dropsNotKept struct{ idemserver.Store }
	// ignoresFingerprint answers another payload's request as its own.
	ignoresFingerprint struct{ idemserver.Store }
	// sweepsLive sweeps an hour ahead, deleting live keys.
	sweepsLive struct{ idemserver.Store }
	// holdsNothing is a LocalStore whose BeginHeld is Begin: its keys
	// lapse with their leases while their handlers run.
	holdsNothing struct{ *idemserver.MemoryStore }
)

func (s holdsNothing) BeginHeld(ctx context.Context, b idemserver.Begin) (idemserver.Claim, error) {
	return s.Begin(ctx, b)
}

func (s completeIgnoresLease) Complete(ctx context.Context, c idemserver.Completion) error {
	c.Now = time.Time{}
	return s.Store.Complete(ctx, c)
}

func (s renewIgnoresLease) Renew(ctx context.Context, id, token string, _, until time.Time) error {
	return s.Store.Renew(ctx, id, token, time.Time{}, until)
}

func (s dropsNotKept) Complete(ctx context.Context, c idemserver.Completion) error {
	r := *c.Response
	r.NotKept = false
	c.Response = &r
	return s.Store.Complete(ctx, c)
}

func (s ignoresFingerprint) Begin(ctx context.Context, b idemserver.Begin) (idemserver.Claim, error) {
	b.Fingerprint = ""
	return s.Store.Begin(ctx, b)
}

func (s sweepsLive) Sweep(ctx context.Context, now time.Time) (int, error) {
	return s.Store.Sweep(ctx, now.Add(time.Hour))
}

var broken = map[string]struct {
	wrap func(idemserver.Store) idemserver.Store
	// fails is a subtest the suite must fail.
	fails string
}{
	"completeIgnoresLease": {func(s idemserver.Store) idemserver.Store { return completeIgnoresLease{s} }, "CompleteAfterLapseIsLost"},
	"renewIgnoresLease":    {func(s idemserver.Store) idemserver.Store { return renewIgnoresLease{s} }, "RenewAfterLapseIsLost"},
	"dropsNotKept":         {func(s idemserver.Store) idemserver.Store { return dropsNotKept{s} }, "NotKeptRoundTrip"},
	"ignoresFingerprint":   {func(s idemserver.Store) idemserver.Store { return ignoresFingerprint{s} }, "OtherPayloadIsMismatch"},
	"sweepsLive":           {func(s idemserver.Store) idemserver.Store { return sweepsLive{s} }, "SweepDeletesExpired"},
	"holdsNothing":         {func(s idemserver.Store) idemserver.Store { return holdsNothing{s.(*idemserver.MemoryStore)} }, "HeldKeyOutlivesLease"},
}

// envBroken names the broken store TestBrokenStoreChild runs the suite on.
const envBroken = "IDEMSERVER_STORETEST_BROKEN"

// TestBrokenStoreChild runs the suite on the broken store named by
// envBroken; it is run by TestSuiteFailsBrokenStores in a child process,
// whose failure is the expected outcome.
func TestBrokenStoreChild(t *testing.T) {
	name := os.Getenv(envBroken)
	if name == "" {
		t.Skip("run by TestSuiteFailsBrokenStores")
	}
	storetest.Run(t, storetest.Config{Open: func(*testing.T) idemserver.Store { return broken[name].wrap(idemserver.NewMemoryStore()) }})
}

// TestSuiteFailsBrokenStores checks that the suite catches each broken
// store, in the subtest that tests the rule it breaks.
func TestSuiteFailsBrokenStores(t *testing.T) {
	for name, b := range broken {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenStoreChild$", "-test.v")
			cmd.Env = append(os.Environ(), envBroken+"="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed the broken store %s:\n%s", name, out)
			}
			if want := "--- FAIL: TestBrokenStoreChild/" + b.fails; !strings.Contains(string(out), want) {
				t.Errorf("the suite did not fail %s in %s:\n%s", name, b.fails, out)
			}
		})
	}
}

// TestMemoryStorePasses is the control: the unbroken store passes.
func TestMemoryStorePasses(t *testing.T) {
	storetest.Run(t, storetest.Config{Open: func(*testing.T) idemserver.Store { return idemserver.NewMemoryStore() }})
}
