package crashstate

import (
	"bytes"
	"strings"
	"testing"
)

// A trace as strace -f -xx -yy writes it: a file created, written and
// synced, a second write unsynced, a socket write, the directory synced.
const trace = `100 openat(AT_FDCWD<\x2f>, "\x2f\x72\x2f\x66", O_RDWR|O_CREAT|O_CLOEXEC, 0600) = 3<\x2f\x72\x2f\x66>
100 pwrite64(3<\x2f\x72\x2f\x66>, "\x61\x61", 2, 0) = 2
101 fdatasync(3<\x2f\x72\x2f\x66> <unfinished ...>
100 write(1<pipe:[7]>, "\x40\x63\x72\x61\x73\x68\x74\x65\x73\x74\x20\x78\x0a", 13) = 13
101 <... fdatasync resumed>)                = 0
100 pwrite64(3<\x2f\x72\x2f\x66>, "` + "%s" + `", 1024, 512) = 1024
100 write(5<TCP:[127.0.0.1:1->127.0.0.1:2]>, "\x50\x4f\x53\x54", 4) = 4
100 fsync(4<\x2f\x72>) = 0
100 fdatasync(3<\x2f\x72\x2f\x66>) = -1 EIO (Input/output error) (INJECTED)
100 +++ exited with 0 +++
`

func TestParseAndStates(t *testing.T) {
	b := strings.Repeat(`\x62`, 1024)
	ops, err := Parse([]byte(strings.Replace(trace, "%s", b, 1)), "/r")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range ops {
		kinds = append(kinds, o.Kind.String())
	}
	if got, want := strings.Join(kinds, " "), "create write mark sync write send dirsync sync"; got != want {
		t.Fatalf("ops %q, want %q", got, want)
	}
	if ops[4].Off != 512 || len(ops[4].Data) != 1024 || !ops[7].Injected || ops[7].Errno != "EIO" || ops[5].Sock == "" {
		t.Fatalf("parsed wrong: %+v %+v %+v", ops[4], ops[5], ops[7])
	}
	// After the send (op 5): the file's name is not durable yet, the
	// second write is not synced.
	seen := map[string]bool{}
	_, err = States("/r", ops[:6], Options{}, func(s State) error {
		if s.Point != 5 {
			return nil
		}
		f, ok := s.Files["f"]
		switch {
		case !ok:
			seen["gone"] = true
		case bytes.Equal(f, []byte("aa")):
			seen["dropped"] = true
		case len(f) == 1536 && f[512] == 'b' && f[1535] == 'b':
			seen["kept"] = true
		case len(f) == 1024 && f[1023] == 'b':
			seen["torn"] = true
		default:
			t.Errorf("unexpected state %q: %d bytes", s.Why, len(f))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"gone", "dropped", "kept", "torn"} {
		if !seen[k] {
			t.Errorf("no %s state at the send", k)
		}
	}
	// After the directory sync the name stays; the failed fdatasync made
	// nothing durable, so the unsynced write may still be dropped.
	gone, dropped := false, false
	_, _ = States("/r", ops, Options{}, func(s State) error {
		if s.Point == 7 {
			f, ok := s.Files["f"]
			gone = gone || !ok
			dropped = dropped || bytes.Equal(f, []byte("aa"))
		}
		return nil
	})
	if gone || !dropped {
		t.Errorf("after the directory sync and a failed fdatasync: gone %v (want false), dropped %v (want true)", gone, dropped)
	}
}

// TestKindStringOutOfRange: a Kind no trace parses, such as a zero Op's
// or one from a newer parser, prints as a number instead of panicking.
func TestKindStringOutOfRange(t *testing.T) {
	for k, want := range map[Kind]string{0: "?", Write: "write", Mark: "mark", Mark + 1: "Kind(11)", -1: "Kind(-1)"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}
