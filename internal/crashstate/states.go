package crashstate

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Sector is the unit a disk writes whole: a torn write keeps whole
// sectors only.
const Sector = 512

// State is one state of the files a crash at a point may leave.
type State struct {
	// Point is the index of the last op before the crash.
	Point int
	// Why says which state of the point this is, for a failure message.
	Why string
	// Files maps each name under the recording's root (relative) to its
	// content.
	Files map[string][]byte
}

// Hash identifies the state's files.
func (s State) Hash() [32]byte {
	names := make([]string, 0, len(s.Files))
	for n := range s.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(s.Files[n]))
		h.Write(s.Files[n])
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// Materialize writes the state's files under dir (which it empties
// first).
func (s State) Materialize(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	for n, b := range s.Files {
		p := filepath.Join(dir, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// inode is a file's content: what is durable and the changes since.
type inode struct {
	durable []byte
	pending []Op // Write and Truncate since the last successful sync
}

func (n *inode) apply(b []byte, o Op) []byte {
	switch o.Kind {
	case Truncate:
		if int64(len(b)) >= o.Size {
			return b[:o.Size]
		}
		return append(b, make([]byte, o.Size-int64(len(b)))...)
	case Write:
		off := o.Off
		if off < 0 {
			off = int64(len(b))
		}
		if end := off + int64(len(o.Data)); end > int64(len(b)) {
			b = append(b, make([]byte, end-int64(len(b)))...)
		}
		copy(b[off:], o.Data)
	}
	return b
}

func (n *inode) content(ops []Op) []byte {
	b := append([]byte(nil), n.durable...)
	for _, o := range ops {
		b = n.apply(b, o)
	}
	return b
}

// nsChange is a change of a directory's names since its last sync.
type nsChange struct {
	op  Op
	ino *inode // the inode a Create or Rename names
}

// model is the file system as the trace has changed it so far.
type model struct {
	root    string
	names   map[string]*inode // the names now
	durable map[string]*inode // the names a crash keeps for sure
	changes []nsChange        // name changes since the last sync of their directory
}

func newModel(root string) *model {
	return &model{root: filepath.Clean(root), names: map[string]*inode{}, durable: map[string]*inode{}}
}

func (m *model) step(o Op) {
	switch o.Kind {
	case Create:
		ino := &inode{}
		m.names[o.Path] = ino
		m.changes = append(m.changes, nsChange{o, ino})
	case Write, Truncate:
		// A write that returned -1 transferred nothing (a partial one
		// returns its count, and its Data is cut to it).
		if ino := m.names[o.Path]; ino != nil && o.Errno == "" {
			ino.pending = append(ino.pending, o)
		}
	case Sync:
		if ino := m.names[o.Path]; ino != nil && o.Errno == "" {
			ino.durable = ino.content(ino.pending)
			ino.pending = nil
		}
	case Rename:
		if o.Errno != "" {
			return
		}
		ino := m.names[o.From]
		delete(m.names, o.From)
		if ino != nil {
			m.names[o.Path] = ino
		}
		m.changes = append(m.changes, nsChange{o, ino})
	case Link:
		if o.Errno != "" || m.names[o.From] == nil {
			return
		}
		m.names[o.Path] = m.names[o.From]
		m.changes = append(m.changes, nsChange{o, m.names[o.From]})
	case Unlink:
		if o.Errno != "" {
			return
		}
		delete(m.names, o.Path)
		m.changes = append(m.changes, nsChange{o, nil})
	case DirSync:
		if o.Errno != "" {
			return
		}
		// The changes in this directory are durable, in order; others stay.
		var left []nsChange
		for _, c := range m.changes {
			if filepath.Dir(c.op.Path) == o.Path || ((c.op.Kind == Rename || c.op.Kind == Link) && filepath.Dir(c.op.From) == o.Path) {
				applyNS(m.durable, c)
				continue
			}
			left = append(left, c)
		}
		m.changes = left
	}
}

func applyNS(ns map[string]*inode, c nsChange) {
	switch c.op.Kind {
	case Create, Link:
		ns[c.op.Path] = c.ino
	case Rename:
		ino := ns[c.op.From]
		if ino == nil {
			ino = c.ino
		}
		delete(ns, c.op.From)
		ns[c.op.Path] = ino
	case Unlink:
		delete(ns, c.op.Path)
	}
}

// Options bound the states of a point.
type Options struct {
	// MaxTorn caps the torn variants of a write (its sector prefixes);
	// zero means every one.
	MaxTorn int
}

// States returns the crash states of ops at every point that matters:
// after each sync of a file or directory, each name change, each socket
// write and each emitted line, and at the end. points, if not nil, says
// which op indexes to crash after (each is a point).
func States(root string, ops []Op, o Options, emit func(State) error) (points int, err error) {
	m := newModel(root)
	for i, op := range ops {
		m.step(op)
		switch op.Kind {
		case Sync, DirSync, Create, Rename, Unlink, Send, Mark:
		default:
			if i != len(ops)-1 {
				continue
			}
		}
		points++
		if err := m.states(i, o, emit); err != nil {
			return points, err
		}
	}
	return points, nil
}

// states emits the states of a crash right after op i.
func (m *model) states(i int, o Options, emit func(State) error) error {
	// Which names a crash may leave: any prefix of the pending changes.
	nsVariants := make([]map[string]*inode, 0, len(m.changes)+1)
	ns := copyNS(m.durable)
	nsVariants = append(nsVariants, copyNS(ns))
	for _, c := range m.changes {
		applyNS(ns, c)
		nsVariants = append(nsVariants, copyNS(ns))
	}
	full := nsVariants[len(nsVariants)-1]
	build := func(ns map[string]*inode, vary *inode, content []byte, why string) error {
		st := State{Point: i, Why: why, Files: map[string][]byte{}}
		for p, ino := range ns {
			rel, err := filepath.Rel(m.root, p)
			if err != nil || strings.HasPrefix(rel, "..") {
				continue
			}
			if ino == nil {
				continue
			}
			if ino == vary {
				st.Files[rel] = content
			} else {
				st.Files[rel] = ino.content(ino.pending)
			}
		}
		return emit(st)
	}
	// Every name change kept, every write kept.
	if err := build(full, nil, nil, "all writes kept"); err != nil {
		return err
	}
	// The content states of each file with unsynced changes.
	seen := map[*inode]bool{}
	for _, p := range sortedNames(full) {
		ino := full[p]
		if ino == nil || seen[ino] || len(ino.pending) == 0 {
			continue
		}
		seen[ino] = true
		base := filepath.Base(p)
		if err := build(full, ino, ino.content(nil), base+": unsynced writes dropped"); err != nil {
			return err
		}
		if len(ino.pending) > 1 {
			for j := range ino.pending {
				why := fmt.Sprintf("%s: only unsynced change %d of %d kept (%s)", base, j+1, len(ino.pending), ino.pending[j])
				if err := build(full, ino, ino.content(ino.pending[j:j+1]), why); err != nil {
					return err
				}
			}
		}
		// The last write torn at each sector, the earlier ones kept.
		last := ino.pending[len(ino.pending)-1]
		if last.Kind == Write && last.Off >= 0 {
			for _, cut := range tornCuts(last.Off, len(last.Data), o.MaxTorn) {
				t := last
				t.Data = last.Data[:cut]
				ops := append(append([]Op(nil), ino.pending[:len(ino.pending)-1]...), t)
				why := fmt.Sprintf("%s: last write (%s) torn after %d bytes", base, last, cut)
				if err := build(full, ino, ino.content(ops), why); err != nil {
					return err
				}
			}
		}
	}
	// The name states: each prefix of the unsynced name changes, with the
	// files' writes all kept, and all dropped.
	for k := 0; k < len(nsVariants)-1; k++ {
		why := fmt.Sprintf("%d of %d unsynced name changes kept", k, len(m.changes))
		if k < len(m.changes) {
			why += fmt.Sprintf(" (the next, lost, is %s)", m.changes[k].op)
		}
		if err := build(nsVariants[k], nil, nil, why+", writes kept"); err != nil {
			return err
		}
		st := State{Point: i, Why: why + ", unsynced writes dropped", Files: map[string][]byte{}}
		for p, ino := range nsVariants[k] {
			if rel, err := filepath.Rel(m.root, p); err == nil && !strings.HasPrefix(rel, "..") && ino != nil {
				st.Files[rel] = ino.content(nil)
			}
		}
		if err := emit(st); err != nil {
			return err
		}
	}
	return nil
}

// tornCuts returns the lengths a write of n bytes at off may be torn at:
// each sector boundary inside it, at most max of them (spread) if max > 0.
func tornCuts(off int64, n, max int) []int {
	var cuts []int
	for b := (off/Sector + 1) * Sector; b < off+int64(n); b += Sector {
		cuts = append(cuts, int(b-off))
	}
	if max > 0 && len(cuts) > max {
		spread := make([]int, 0, max)
		for i := 0; i < max; i++ {
			spread = append(spread, cuts[i*(len(cuts)-1)/(max-1+boolInt(max == 1))])
		}
		cuts = spread
	}
	return cuts
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func copyNS(ns map[string]*inode) map[string]*inode {
	out := make(map[string]*inode, len(ns))
	for k, v := range ns {
		out[k] = v
	}
	return out
}

func sortedNames(ns map[string]*inode) []string {
	out := make([]string, 0, len(ns))
	for k := range ns {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
