//go:build !unix

package idemserver_test

import "time"

// cpuTime returns 0: the CPU time of the process is read on unix only.
func cpuTime() time.Duration { return 0 }
