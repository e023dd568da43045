//go:build !race

package idemserver_test

// raceEnabled says the race detector is on: it changes what escapes, so
// allocation counts are not checked.
const raceEnabled = false
