package chaoskit

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/idemgo/idem/internal/crashtest"
)

// KillPoint returns after how many lines to kill a child that has todo
// operations to do and writes about perTodo lines per operation, when left
// kills (this one included) remain: a random point, spread so that each
// remaining kill gets a share of the remaining work.
func KillPoint(rng *rand.Rand, todo, perTodo, left int) int {
	return 1 + rng.IntN(max(1, perTodo*todo/(left+1)))
}

// KillLife reads a started child's first line, "todo <n>", then kills it
// with SIGKILL at KillPoint(rng, n, perTodo, left) and returns every line
// it wrote. It returns an error, with the lines so far, if the child ended
// before saying anything or said something else first.
func KillLife(c *crashtest.Child, rng *rand.Rand, perTodo, left int) ([]string, error) {
	first, ok := c.Next()
	if !ok {
		return c.Kill(), errors.New("chaoskit: the child ended before saying anything")
	}
	todo, err := strconv.Atoi(strings.TrimPrefix(first, "todo "))
	if err != nil {
		return c.Kill(), fmt.Errorf("chaoskit: the child's first line %q: %w", first, err)
	}
	return c.KillAfter(KillPoint(rng, todo, perTodo, left)), nil
}

// Lines is what a child's lines said, counted.
type Lines struct {
	Resumed  int      // "resumed" lines: operations finished by Resume
	GaveUp   int      // "gaveup" lines: operations left to a later life
	Complete bool     // "complete": the child ended its run cleanly
	Fatal    []string // the messages of "fatal" lines
}

// Scan counts a child's lines.
func Scan(lines []string) Lines {
	var l Lines
	for _, line := range lines {
		verb, rest, _ := strings.Cut(line, " ")
		switch verb {
		case "resumed":
			l.Resumed++
		case "gaveup":
			l.GaveUp++
		case "complete":
			l.Complete = true
		case "fatal":
			l.Fatal = append(l.Fatal, rest)
		}
	}
	return l
}

// Names returns name(i) for i in [0, n).
func Names(n int, name func(i int) string) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = name(i)
	}
	return names
}

// FaultKinds returns faults as "kind count" items, sorted, for a log line.
func FaultKinds[K comparable](faults map[K]int) string {
	kinds := make([]string, 0, len(faults))
	for f, n := range faults {
		kinds = append(kinds, fmt.Sprintf("%v %d", f, n))
	}
	slices.Sort(kinds)
	return "[" + strings.Join(kinds, ", ") + "]"
}

// errLookup wraps a journal's error in a check.
func errLookup(name string, err error) error {
	return fmt.Errorf("chaoskit: journal: operation %q: %w", name, err)
}
