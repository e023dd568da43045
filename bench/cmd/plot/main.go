// Command plot reads `go test -bench BenchmarkPeers` output on stdin and
// writes a PNG of requests per second against requests in flight, one line
// per library, one panel per server mode (ok, fail10). It uses only the
// standard library.
//
//	go run ./cmd/plot -o out/peers.png < out/peers.txt
package main

import (
	"bufio"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"log"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// point is one benchmark result.
type point struct {
	mode, lib string
	inflight  int
	rps       float64
}

var lineRE = regexp.MustCompile(`^BenchmarkPeers/([^/]+)/inflight=(\d+)/([^/\s]+?)(?:-\d+)?\s`)

func parse(r io.Reader) ([]point, error) {
	var pts []point
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		m := lineRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		f := strings.Fields(line)
		for i := 1; i < len(f); i++ {
			if f[i] == "req/s" {
				rps, err := strconv.ParseFloat(f[i-1], 64)
				if err != nil {
					return nil, fmt.Errorf("%q: %w", line, err)
				}
				n, _ := strconv.Atoi(m[2])
				pts = append(pts, point{mode: m[1], lib: m[3], inflight: n, rps: rps})
			}
		}
	}
	return pts, sc.Err()
}

var palette = []color.RGBA{
	{0x77, 0x77, 0x77, 0xff}, // grey
	{0x1f, 0x77, 0xb4, 0xff}, // blue
	{0x2c, 0xa0, 0x2c, 0xff}, // green
	{0xd6, 0x27, 0x28, 0xff}, // red
	{0xff, 0x7f, 0x0e, 0xff}, // orange
	{0x94, 0x67, 0xbd, 0xff}, // purple
}

type canvas struct{ *image.RGBA }

func (c canvas) rect(x0, y0, x1, y1 int, col color.Color) {
	for y := y0; y <= y1; y++ {
		for x := x0; x <= x1; x++ {
			c.Set(x, y, col)
		}
	}
}

// line draws a line of the given thickness.
func (c canvas) line(x0, y0, x1, y1 float64, w int, col color.Color) {
	steps := int(math.Max(math.Abs(x1-x0), math.Abs(y1-y0))) + 1
	for i := 0; i <= steps; i++ {
		t := float64(i) / float64(steps)
		x, y := int(x0+(x1-x0)*t), int(y0+(y1-y0)*t)
		c.rect(x-w/2, y-w/2, x+w/2, y+w/2, col)
	}
}

// text writes s with its top-left corner at (x, y), scale pixels a dot.
func (c canvas) text(x, y int, s string, scale int, col color.Color) {
	for _, r := range strings.ToLower(s) {
		g, ok := font3x5[r]
		if !ok {
			g = font3x5[' ']
		}
		for i, p := range g {
			if p == '#' {
				px, py := x+(i%3)*scale, y+(i/3)*scale
				c.rect(px, py, px+scale-1, py+scale-1, col)
			}
		}
		x += 4 * scale
	}
}

func textWidth(s string, scale int) int { return len(s) * 4 * scale }

func main() {
	out := flag.String("o", "peers.png", "PNG to write")
	flag.Parse()
	pts, err := parse(os.Stdin)
	if err != nil {
		log.Fatal(err)
	}
	if len(pts) == 0 {
		log.Fatal("plot: no BenchmarkPeers lines with req/s on stdin")
	}
	var modes, libs []string
	var ymax float64
	for _, p := range pts {
		if !slices.Contains(modes, p.mode) {
			modes = append(modes, p.mode)
		}
		if !slices.Contains(libs, p.lib) {
			libs = append(libs, p.lib)
		}
		ymax = max(ymax, p.rps)
	}
	step := math.Pow(10, math.Floor(math.Log10(ymax)))
	if ymax/step < 3 {
		step /= 2
	}
	ymax = math.Ceil(ymax/step) * step

	const panelW, panelH, margin, scale = 460, 380, 70, 2
	W, H := margin+len(modes)*(panelW+margin), panelH+2*margin+30*(len(libs)+1)
	c := canvas{image.NewRGBA(image.Rect(0, 0, W, H))}
	c.rect(0, 0, W-1, H-1, color.White)
	black, light := color.RGBA{0, 0, 0, 0xff}, color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	xs := []int{1, 32, 128}
	xpos := func(n int) float64 { return math.Log2(float64(n)) / 7 } // 1..128 on log2

	for mi, mode := range modes {
		left, top := margin+mi*(panelW+margin), margin
		bottom, right := top+panelH, left+panelW
		title := "req/s vs in flight - " + mode
		if mode == "fail10" {
			title += " (10% 503)"
		}
		c.text(left+(panelW-textWidth(title, scale))/2, top-30, title, scale, black)
		for v := 0.0; v <= ymax+step/2; v += step {
			y := float64(bottom) - v/ymax*float64(panelH)
			c.line(float64(left), y, float64(right), y, 1, light)
			lbl := strconv.Itoa(int(v))
			c.text(left-8-textWidth(lbl, scale), int(y)-5, lbl, scale, black)
		}
		for _, n := range xs {
			x := float64(left) + xpos(n)*float64(panelW)
			c.line(x, float64(top), x, float64(bottom), 1, light)
			lbl := strconv.Itoa(n)
			c.text(int(x)-textWidth(lbl, scale)/2, bottom+8, lbl, scale, black)
		}
		c.text(left+(panelW-textWidth("requests in flight", scale))/2, bottom+26, "requests in flight", scale, black)
		c.line(float64(left), float64(top), float64(left), float64(bottom), 2, black)
		c.line(float64(left), float64(bottom), float64(right), float64(bottom), 2, black)
		for li, lib := range libs {
			col := palette[li%len(palette)]
			var line []point
			for _, p := range pts {
				if p.mode == mode && p.lib == lib {
					line = append(line, p)
				}
			}
			slices.SortFunc(line, func(a, b point) int { return a.inflight - b.inflight })
			for i, p := range line {
				x := float64(left) + xpos(p.inflight)*float64(panelW)
				y := float64(bottom) - p.rps/ymax*float64(panelH)
				c.rect(int(x)-4, int(y)-4, int(x)+4, int(y)+4, col)
				if i > 0 {
					q := line[i-1]
					c.line(float64(left)+xpos(q.inflight)*float64(panelW), float64(bottom)-q.rps/ymax*float64(panelH), x, y, 3, col)
				}
			}
		}
	}
	cols := max(1, (W-margin)/260)
	for li, lib := range libs {
		x := margin + (li%cols)*260
		y := panelH + margin + 50 + (li/cols)*30
		c.rect(x, y, x+24, y+10, palette[li%len(palette)])
		c.text(x+34, y, lib, scale, black)
	}
	f, err := os.Create(*out)
	if err != nil {
		log.Fatal(err)
	}
	if err := png.Encode(f, c); err != nil {
		log.Fatal(err)
	}
	if err := f.Close(); err != nil {
		log.Fatal(err)
	}
}
