// Command usershaped measures idem the way a user comparing libraries does,
// rather than the way BENCHMARKS.md's go test benchmarks do: one process,
// an httptest server in it whose handler drains the body and answers 201
// with 13 bytes; a fresh http.NewRequest per call with a 40-byte JSON body
// from strings.NewReader; idem.Open with default options, one journal on
// /dev/shm and one on disk open side by side; bare net/http with
// MaxIdleConnsPerHost 256; a fixed number of goroutines; short windows
// after a warm-up; the contestants interleaved over several rounds, and
// medians printed as ratios to bare net/http.
//
//	go run ./bench/cmd/usershaped                 # 5 rounds, 32 and 1 in flight
//	go run ./bench/cmd/usershaped -rounds 9 -window 2s
//
// Flags turn each difference between the two harnesses on and off one at
// a time, so that the gap between them can be accounted for:
//
//	-child        the server in a child process (as the go test benchmarks run it)
//	-base256      give idem's base transport MaxIdleConnsPerHost 256 too
//	-stdbase      give idem http.DefaultTransport (2 idle per host), the default before round 5
//	-onejournal   open only the journal being measured, not both side by side
//	-fresh        a fresh journal for every window (the benchmarks' b.TempDir)
//
// It also measures bbolt's own single-Put commit rate on the same disk
// (one db.Update per Put, one goroutine), the ceiling of a durable request
// at 1 in flight.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemgo/idem"
	bolt "go.etcd.io/bbolt"
)

const body40 = `{"order":"42","amount":4200,"cur":"eur"}` // 40 bytes

var (
	rounds     = flag.Int("rounds", 5, "interleaved rounds; medians are printed")
	window     = flag.Duration("window", 700*time.Millisecond, "measured window per contestant and round")
	warmup     = flag.Duration("warmup", 175*time.Millisecond, "warm-up before each window")
	inflights  = flag.String("inflight", "32,1", "comma-separated goroutine counts")
	diskDir    = flag.String("disk", "", "directory on disk for the disk journal (default: a temporary directory under the working directory)")
	shmDir     = flag.String("shm", "/dev/shm", "directory on tmpfs for the tmpfs journal")
	child      = flag.Bool("child", false, "run the server in a child process")
	base256    = flag.Bool("base256", false, "give idem's base transport MaxIdleConnsPerHost 256")
	stdBase    = flag.Bool("stdbase", false, "give idem http.DefaultTransport itself (2 idle connections per host), as releases before round 5 did by default")
	oneJournal = flag.Bool("onejournal", false, "open only the journal being measured")
	fresh      = flag.Bool("fresh", false, "a fresh journal for every window")
	serveFlag  = flag.Bool("serve", false, "internal: be the child server")
	only       = flag.String("only", "", "measure only this contestant (net/http, idem-tmpfs, idem-disk), for profiling")
	cpuProfile = flag.String("cpuprofile", "", "write a CPU profile of the last measured window to this file")
)

func handler(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"ok_1"}`) // 13 bytes
}

func main() {
	flag.Parse()
	log.SetFlags(0)
	if *serveFlag {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(l.Addr().String())
		go func() { io.Copy(io.Discard, os.Stdin); os.Exit(0) }() // parent gone: stop
		log.Fatal(http.Serve(l, http.HandlerFunc(handler)))
	}
	url, stop := startServer()
	defer stop()

	dir := *diskDir
	if dir == "" {
		d, err := os.MkdirTemp(".", "usershaped-")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(d)
		dir = d
	}
	shm, err := os.MkdirTemp(*shmDir, "usershaped-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(shm)

	fmt.Printf("# %s, GOMAXPROCS %d, child=%v base256=%v stdbase=%v onejournal=%v fresh=%v, %d rounds of %v after %v\n",
		time.Now().UTC().Format(time.RFC3339), runtime.GOMAXPROCS(0), *child, *base256, *stdBase, *oneJournal, *fresh, *rounds, *window, *warmup)
	putRate := boltPutRate(dir)
	fmt.Printf("bbolt single-Put commits on disk: %.0f/s\n", putRate)

	for _, f := range strings.Split(*inflights, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			log.Fatalf("bad -inflight %q", f)
		}
		runAt(n, url, dir, shm, putRate)
	}
}

// contestant is one client under test.
type contestant struct {
	name string
	path string // journal path, "" for bare net/http
	do   func(*http.Request) (*http.Response, error)
	cl   func()
}

func bareTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 256
	return t
}

func openIdem(path string) (func(*http.Request) (*http.Response, error), func()) {
	var opts []idem.Option
	switch {
	case *base256:
		opts = append(opts, idem.WithBaseTransport(bareTransport()))
	case *stdBase:
		opts = append(opts, idem.WithBaseTransport(http.DefaultTransport))
	}
	c, err := idem.Open(path, opts...)
	if err != nil {
		log.Fatal(err)
	}
	return c.HTTPClient().Do, func() { c.Close() }
}

type sample struct{ rps, cpu float64 }

func runAt(inflight int, url, disk, shm string, putRate float64) {
	bare := &http.Client{Transport: bareTransport()}
	cs := []*contestant{
		{name: "net/http", do: bare.Do, cl: func() {}},
		{name: "idem-tmpfs", path: filepath.Join(shm, fmt.Sprintf("j%d.db", inflight))},
		{name: "idem-disk", path: filepath.Join(disk, fmt.Sprintf("j%d.db", inflight))},
	}
	open := func(c *contestant, gen int) {
		if c.path == "" || c.do != nil {
			return
		}
		p := c.path
		if *fresh {
			p = fmt.Sprintf("%s.%d", c.path, gen)
		}
		c.do, c.cl = openIdem(p)
	}
	closeIdem := func(c *contestant) {
		if c.path != "" && c.do != nil {
			c.cl()
			c.do = nil
		}
	}
	if !*oneJournal && !*fresh {
		for _, c := range cs {
			open(c, 0)
		}
	}
	if *only != "" {
		cs = slices.DeleteFunc(cs, func(c *contestant) bool {
			if c.name != *only {
				closeIdem(c)
				return true
			}
			return false
		})
		if len(cs) == 0 {
			log.Fatalf("-only %q: no such contestant", *only)
		}
	}
	res := make(map[string][]sample)
	for r := range *rounds {
		for _, c := range cs {
			if *oneJournal || *fresh {
				open(c, r)
			}
			s := measure(inflight, url, c.do)
			res[c.name] = append(res[c.name], s)
			if *oneJournal || *fresh {
				closeIdem(c)
			}
		}
	}
	for _, c := range cs {
		closeIdem(c)
	}
	med := func(name string, f func(sample) float64) float64 {
		v := make([]float64, 0, len(res[name]))
		for _, s := range res[name] {
			v = append(v, f(s))
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	rps := func(s sample) float64 { return s.rps }
	cpu := func(s sample) float64 { return s.cpu }
	base := med(cs[0].name, rps)
	fmt.Printf("\n%d in flight:\n", inflight)
	for _, c := range cs {
		var per []string
		for _, s := range res[c.name] {
			per = append(per, fmt.Sprintf("%.2f", s.rps/base))
		}
		fmt.Printf("  %-10s %8.0f req/s  %6.1f cpu-µs/req  ÷ net/http %.2f (per round %s)\n",
			c.name, med(c.name, rps), med(c.name, cpu), med(c.name, rps)/base, strings.Join(per, " "))
	}
	if inflight == 1 && len(res["idem-disk"]) > 0 {
		fmt.Printf("  idem-disk ÷ bbolt single-Put commits: %.2f\n", med("idem-disk", rps)/putRate)
	}
}

// measure runs inflight goroutines sending keyed POSTs: warmup, then one
// window counted. It returns requests per second and CPU per request of
// the whole process (client and, unless -child, server).
func measure(inflight int, url string, do func(*http.Request) (*http.Response, error)) sample {
	var count atomic.Int64
	var counting, stop atomic.Bool
	var wg sync.WaitGroup
	for range inflight {
		wg.Go(func() {
			for !stop.Load() {
				req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body40))
				if err != nil {
					log.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := do(req)
				if err != nil {
					log.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					log.Fatalf("status %d", resp.StatusCode)
				}
				if counting.Load() {
					count.Add(1)
				}
			}
		})
	}
	time.Sleep(*warmup)
	if *cpuProfile != "" {
		f, err := os.OpenFile(*cpuProfile, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	cpu0 := cpuTime()
	t0 := time.Now()
	counting.Store(true)
	time.Sleep(*window)
	counting.Store(false)
	el := time.Since(t0)
	cpu := cpuTime() - cpu0
	stop.Store(true)
	wg.Wait()
	n := float64(count.Load())
	return sample{rps: n / el.Seconds(), cpu: float64(cpu.Microseconds()) / n}
}

// boltPutRate is bbolt's single-Put commit rate in dir: one Update per
// Put of a 200-byte value under a new 36-byte key, one goroutine, 2 s.
func boltPutRate(dir string) float64 {
	p := filepath.Join(dir, "put.db")
	defer os.Remove(p)
	db, err := bolt.Open(p, 0o600, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	val := make([]byte, 200)
	n := 0
	t0 := time.Now()
	for time.Since(t0) < 2*time.Second {
		k := fmt.Appendf(nil, "%036d", n)
		if err := db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("b"))
			if err != nil {
				return err
			}
			return b.Put(k, val)
		}); err != nil {
			log.Fatal(err)
		}
		n++
	}
	return float64(n) / time.Since(t0).Seconds()
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startServer() (string, func()) {
	if !*child {
		s := httptest.NewServer(http.HandlerFunc(handler))
		return s.URL, s.Close
	}
	cmd := exec.Command(os.Args[0], "-serve")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		log.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		log.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		log.Fatal(err)
	}
	return "http://" + strings.TrimSpace(addr), func() { in.Close(); cmd.Wait() }
}
