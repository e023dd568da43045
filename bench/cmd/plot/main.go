// Command plot reads `go test -bench BenchmarkPeers` output on stdin and
// writes a PNG of requests per second against requests in flight, one line
// per library, one panel per server mode (ok, fail10). Both axes are
// logarithmic: idem-bbolt at one in flight is an order of magnitude below
// the others. Drawn with gonum.org/v1/plot.
//
//	go run ./cmd/plot -o out/peers.png < out/peers.txt
package main

import (
	"bufio"
	"flag"
	"fmt"
	"image/color"
	"io"
	"log"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
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

// styles gives each library a colour and dash pattern that stay the same
// in every panel; idem's lines are solid and thicker.
var styles = map[string]struct {
	c    color.RGBA
	dash []vg.Length
}{
	"nethttp":       {color.RGBA{0x66, 0x66, 0x66, 0xff}, []vg.Length{vg.Points(2), vg.Points(2)}},
	"retryablehttp": {color.RGBA{0x1f, 0x77, 0xb4, 0xff}, []vg.Length{vg.Points(6), vg.Points(2)}},
	"failsafehttp":  {color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, []vg.Length{vg.Points(6), vg.Points(2), vg.Points(2), vg.Points(2)}},
	"idem-memory":   {color.RGBA{0xff, 0x7f, 0x0e, 0xff}, nil},
	"idem-bbolt":    {color.RGBA{0xd6, 0x27, 0x28, 0xff}, nil},
}

var titles = map[string]string{
	"ok":     "server always 200",
	"fail10": "10% of attempts answered 503",
}

func panel(mode string, pts []point, libs []string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "keyed POSTs, " + titles[mode]
	if p.Title.Text == "keyed POSTs, " {
		p.Title.Text = mode
	}
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.X.Label.Text = "requests in flight"
	p.Y.Label.Text = "requests per second"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.Y.Tick.Marker = rpsTicks{}
	var xs []plot.Tick
	for _, pt := range pts {
		if pt.mode == mode && !slices.ContainsFunc(xs, func(t plot.Tick) bool { return t.Value == float64(pt.inflight) }) {
			xs = append(xs, plot.Tick{Value: float64(pt.inflight), Label: strconv.Itoa(pt.inflight)})
		}
	}
	p.X.Tick.Marker = plot.ConstantTicks(xs)
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(-8), vg.Points(8)
	p.Legend.Padding = vg.Points(2)
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	for _, lib := range libs {
		var xy plotter.XYs
		for _, pt := range pts {
			if pt.mode == mode && pt.lib == lib {
				xy = append(xy, plotter.XY{X: float64(pt.inflight), Y: pt.rps})
			}
		}
		if len(xy) == 0 {
			continue
		}
		slices.SortFunc(xy, func(a, b plotter.XY) int { return int(a.X - b.X) })
		l, s, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, err
		}
		st := styles[lib]
		if st.c == (color.RGBA{}) {
			st.c = color.RGBA{0x94, 0x67, 0xbd, 0xff}
		}
		l.Color, l.Dashes, l.Width = st.c, st.dash, vg.Points(1.5)
		if strings.HasPrefix(lib, "idem") {
			l.Width = vg.Points(2.5)
		}
		s.Color, s.Shape, s.Radius = st.c, draw.CircleGlyph{}, vg.Points(3)
		p.Add(l, s)
		p.Legend.Add(lib, l, s)
	}
	return p, nil
}

// rpsTicks labels 1, 2 and 5 times each power of ten, so that a log axis
// spanning one decade still reads.
type rpsTicks struct{}

func (rpsTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for p := 1.0; p <= hi*10; p *= 10 {
		for _, m := range []float64{1, 2, 5} {
			v := m * p
			if v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
			}
		}
		for m := 1.0; m < 10; m++ { // unlabelled minor ticks
			if v := m * p; v >= lo && v <= hi && m != 1 && m != 2 && m != 5 {
				ts = append(ts, plot.Tick{Value: v})
			}
		}
	}
	return ts
}

func main() {
	out := flag.String("o", "peers.png", "output PNG file")
	flag.Parse()
	pts, err := parse(os.Stdin)
	if err != nil {
		log.Fatal(err)
	}
	if len(pts) == 0 {
		log.Fatal("no BenchmarkPeers lines with req/s on stdin")
	}
	var modes, libs []string
	for _, pt := range pts {
		if !slices.Contains(modes, pt.mode) {
			modes = append(modes, pt.mode)
		}
		if !slices.Contains(libs, pt.lib) {
			libs = append(libs, pt.lib)
		}
	}
	row := make([]*plot.Plot, len(modes))
	for i, m := range modes {
		if row[i], err = panel(m, pts, libs); err != nil {
			log.Fatal(err)
		}
	}
	w, h := vg.Points(float64(520*len(modes))), vg.Points(440)
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(modes), PadX: vg.Points(24), PadTop: vg.Points(8), PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(16)}
	canvases := plot.Align([][]*plot.Plot{row}, tiles, dc)
	for i, p := range row {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(*out)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		log.Fatal(err)
	}
	if err := f.Close(); err != nil {
		log.Fatal(err)
	}
}
