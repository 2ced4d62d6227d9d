// Command dashrender draws a Grafana dashboard's panels into one PNG from a
// real Prometheus, without Grafana: it reads the dashboard JSON (panels,
// gridPos, titles, units, targets' PromQL and legendFormat), substitutes
// the Grafana variables, runs each target through /api/v1/query_range and
// draws every panel at its grid position: time series as lines with a
// legend, stat panels as a number, rows as a header bar, anything else as a
// labelled box. It is also a check: it lists every panel whose queries
// returned no series (and every target that returned none), and with
// --fail-empty exits 1 when there are any.
//
// scripts/render-dashboard.sh runs it against a local three-node cluster.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

type dashboard struct {
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
		Hide         bool   `json:"hide"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit     string   `json:"unit"`
			Decimals *float64 `json:"decimals"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

// series is one line: its legend and its points (NaN where Prometheus
// answered NaN).
type series struct {
	label string
	ts    []float64 // unix seconds
	vs    []float64
}

type varFlags map[string]string

func (v varFlags) String() string { return fmt.Sprint(map[string]string(v)) }
func (v varFlags) Set(s string) error {
	k, val, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("--var wants NAME=VALUE, got %q", s)
	}
	v[k] = val
	return nil
}

func main() {
	vars := varFlags{}
	dashPath := flag.String("dashboard", "deploy/grafana/sluice.json", "the dashboard JSON")
	prom := flag.String("prometheus", "http://127.0.0.1:9090", "Prometheus base URL")
	out := flag.String("out", "dashboard.png", "the PNG to write")
	rng := flag.Duration("range", 5*time.Minute, "the time range drawn, ending now (or at --end)")
	endFlag := flag.String("end", "", "end of the range, RFC 3339 (default: now)")
	step := flag.Duration("step", 2*time.Second, "query_range step")
	rateInterval := flag.String("rate-interval", "15s", "what $__rate_interval becomes")
	width := flag.Int("width", 1920, "width of the picture in pixels (24 grid columns)")
	rowPx := flag.Int("row-height", 30, "pixels per grid row (Grafana's is 30)")
	timeout := flag.Duration("timeout", 10*time.Second, "bound on each query")
	failEmpty := flag.Bool("fail-empty", false, "exit 1 if a panel's queries returned no series")
	flag.Var(vars, "var", "NAME=VALUE: what $NAME becomes (repeatable); an unset variable becomes .* (Grafana's All)")
	flag.Parse()

	raw, err := os.ReadFile(*dashPath)
	if err != nil {
		fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		fatal(fmt.Errorf("%s: %w", *dashPath, err))
	}
	end := time.Now()
	if *endFlag != "" {
		if end, err = time.Parse(time.RFC3339, *endFlag); err != nil {
			fatal(err)
		}
	}
	start := end.Add(-*rng)
	vars["__rate_interval"] = *rateInterval
	vars["__interval"] = step.String()

	var panels []panel
	for _, p := range d.Panels {
		panels = append(panels, p)
		panels = append(panels, p.Panels...)
	}

	client := &http.Client{Timeout: *timeout}
	cw := vg.Length(*width) / 24
	rh := vg.Length(*rowPx)
	header := vg.Length(60)
	rows := 0
	for _, p := range panels {
		rows = max(rows, p.GridPos.Y+p.GridPos.H)
	}
	W, H := vg.Length(*width), header+rh*vg.Length(rows)+8
	img := vgimg.NewWith(vgimg.UseWH(W, H), vgimg.UseDPI(72), vgimg.UseBackgroundColor(color.RGBA{0xf4, 0xf5, 0xf5, 0xff}))
	dc := draw.New(img)

	dc.FillText(textStyle(20, color.Black, draw.XLeft, draw.YTop), vg.Point{X: 12, Y: H - 10}, d.Title)
	dc.FillText(textStyle(11, color.Gray{0x55}, draw.XLeft, draw.YTop), vg.Point{X: 12, Y: H - 36},
		fmt.Sprintf("%s to %s UTC, step %s, $__rate_interval=%s, %s; drawn by tools/dashrender from %s (not Grafana)",
			start.UTC().Format("2006-01-02 15:04:05"), end.UTC().Format("15:04:05"), *step, *rateInterval, varsText(vars), *dashPath))

	var empty, partial []string
	for _, p := range panels {
		g := p.GridPos
		r := vg.Rectangle{
			Min: vg.Point{X: cw*vg.Length(g.X) + 4, Y: H - header - rh*vg.Length(g.Y+g.H) + 4},
			Max: vg.Point{X: cw*vg.Length(g.X+g.W) - 4, Y: H - header - rh*vg.Length(g.Y) - 4},
		}
		c := draw.Canvas{Canvas: dc.Canvas, Rectangle: r}
		switch p.Type {
		case "row":
			fill(c, color.RGBA{0xdd, 0xe2, 0xe8, 0xff})
			c.FillText(textStyle(14, color.Black, draw.XLeft, draw.YCenter), vg.Point{X: r.Min.X + 8, Y: (r.Min.Y + r.Max.Y) / 2}, p.Title)
			continue
		case "timeseries", "graph", "stat", "gauge":
		default:
			box(c, p.Title, fmt.Sprintf("panel type %q: not drawn by dashrender", p.Type))
			continue
		}
		var all []series
		var errs []string
		for i, t := range p.Targets {
			if t.Hide || t.Expr == "" {
				continue
			}
			q := substitute(t.Expr, vars)
			ss, err := queryRange(client, *prom, q, start, end, *step)
			if err != nil {
				errs = append(errs, err.Error())
				fmt.Fprintf(os.Stderr, "%s, target %d: %v\n", p.Title, i+1, err)
				continue
			}
			if len(ss) == 0 {
				partial = append(partial, fmt.Sprintf("%s: target %d (%s)", p.Title, i+1, legendOr(t.LegendFormat, q)))
			}
			for j := range ss {
				ss[j].label = legend(t.LegendFormat, ss[j].label, q)
			}
			all = append(all, ss...)
		}
		if len(all) == 0 {
			empty = append(empty, p.Title)
		}
		unit := p.FieldConfig.Defaults.Unit
		switch {
		case len(errs) > 0 && len(all) == 0:
			box(c, p.Title, "query error: "+errs[0])
		case p.Type == "stat" || p.Type == "gauge":
			stat(c, p.Title, all, unit)
		default:
			timeseries(c, p.Title, all, unit, start, end)
		}
	}

	f, err := os.Create(*out)
	if err != nil {
		fatal(err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		fatal(err)
	}
	if err := f.Close(); err != nil {
		fatal(err)
	}
	fmt.Printf("wrote %s: %d panels\n", *out, len(panels))
	fmt.Printf("panels whose queries returned no series (%d):\n", len(empty))
	for _, t := range empty {
		fmt.Printf("  %s\n", t)
	}
	fmt.Printf("targets that returned no series (%d):\n", len(partial))
	for _, t := range partial {
		fmt.Printf("  %s\n", t)
	}
	if *failEmpty && len(empty) > 0 {
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "dashrender:", err)
	os.Exit(1)
}

func varsText(v varFlags) string {
	var ks []string
	for k := range v {
		if !strings.HasPrefix(k, "__") {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, "$"+k+"="+v[k])
	}
	if len(parts) == 0 {
		return "all variables All"
	}
	return strings.Join(parts, " ") + ", others All"
}

var varRe = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)`)

// substitute replaces Grafana's $name, ${name}, ${name:fmt} and [[name]]
// by the --var values; unset ones by .* (All, in a =~ matcher).
func substitute(expr string, vars map[string]string) string {
	return varRe.ReplaceAllStringFunc(expr, func(m string) string {
		sm := varRe.FindStringSubmatch(m)
		name := sm[1] + sm[2] + sm[3]
		if v, ok := vars[name]; ok {
			return v
		}
		return ".*"
	})
}

var legendRe = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// legend fills a legendFormat from the series' labels, kept as
// "name=value,..." in label until now; with no format, the labels themselves.
func legend(format, labels, expr string) string {
	if format == "" || format == "__auto" {
		if labels == "" {
			return expr
		}
		return "{" + labels + "}"
	}
	kv := map[string]string{}
	for _, p := range strings.Split(labels, ",") {
		if k, v, ok := strings.Cut(p, "="); ok {
			kv[k] = v
		}
	}
	return legendRe.ReplaceAllStringFunc(format, func(m string) string {
		return kv[legendRe.FindStringSubmatch(m)[1]]
	})
}

func legendOr(format, expr string) string {
	if format != "" {
		return format
	}
	return expr
}

func queryRange(c *http.Client, base, q string, start, end time.Time, step time.Duration) ([]series, error) {
	v := url.Values{}
	v.Set("query", q)
	v.Set("start", strconv.FormatInt(start.Unix(), 10))
	v.Set("end", strconv.FormatInt(end.Unix(), 10))
	v.Set("step", strconv.FormatFloat(step.Seconds(), 'f', -1, 64))
	resp, err := c.Get(strings.TrimRight(base, "/") + "/api/v1/query_range?" + v.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%s: %s", resp.Status, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("prometheus: %s", r.Error)
	}
	var out []series
	for _, res := range r.Data.Result {
		var ks []string
		for k := range res.Metric {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		var parts []string
		for _, k := range ks {
			parts = append(parts, k+"="+res.Metric[k])
		}
		s := series{label: strings.Join(parts, ",")}
		for _, pv := range res.Values {
			t, _ := pv[0].(float64)
			vs, _ := pv[1].(string)
			f, err := strconv.ParseFloat(vs, 64)
			if err != nil {
				f = math.NaN()
			}
			s.ts = append(s.ts, t)
			s.vs = append(s.vs, f)
		}
		out = append(out, s)
	}
	return out, nil
}

func textStyle(size vg.Length, c color.Color, xa draw.XAlignment, ya draw.YAlignment) draw.TextStyle {
	return draw.TextStyle{Color: c, Font: font.From(plot.DefaultFont, size), Handler: plot.DefaultTextHandler, XAlign: xa, YAlign: ya}
}

func fill(c draw.Canvas, col color.Color) {
	r := c.Rectangle
	c.FillPolygon(col, []vg.Point{r.Min, {X: r.Max.X, Y: r.Min.Y}, r.Max, {X: r.Min.X, Y: r.Max.Y}})
}

func frame(c draw.Canvas, title string) {
	fill(c, color.White)
	r := c.Rectangle
	c.StrokeLines(draw.LineStyle{Color: color.Gray{0xc8}, Width: 1}, []vg.Point{r.Min, {X: r.Max.X, Y: r.Min.Y}, r.Max, {X: r.Min.X, Y: r.Max.Y}, r.Min})
	c.FillText(textStyle(12, color.Black, draw.XLeft, draw.YTop), vg.Point{X: r.Min.X + 8, Y: r.Max.Y - 6}, title)
}

func center(c draw.Canvas, size vg.Length, col color.Color, text string) {
	r := c.Rectangle
	c.FillText(textStyle(size, col, draw.XCenter, draw.YCenter), vg.Point{X: (r.Min.X + r.Max.X) / 2, Y: (r.Min.Y+r.Max.Y)/2 - 8}, text)
}

// box draws a panel it could not draw (or whose queries failed): its frame,
// title and why.
func box(c draw.Canvas, title, why string) {
	frame(c, title)
	center(c, 11, color.RGBA{0xb0, 0x30, 0x30, 0xff}, why)
}

func lastValue(s series) float64 {
	for i := len(s.vs) - 1; i >= 0; i-- {
		if !math.IsNaN(s.vs[i]) {
			return s.vs[i]
		}
	}
	return math.NaN()
}

// stat draws the last value of each series (Grafana's stat default,
// reduce lastNotNull), side by side.
func stat(c draw.Canvas, title string, ss []series, unit string) {
	frame(c, title)
	if len(ss) == 0 {
		center(c, 14, color.Gray{0x80}, "No data")
		return
	}
	var vals []string
	for _, s := range ss {
		vals = append(vals, format(lastValue(s), unit))
	}
	center(c, 28, color.RGBA{0x1f, 0x78, 0x3f, 0xff}, strings.Join(vals, "  "))
}

// timeseries draws every series as a line (broken at NaN) with a legend
// under the plot.
func timeseries(c draw.Canvas, title string, ss []series, unit string, start, end time.Time) {
	frame(c, title)
	if len(ss) == 0 {
		center(c, 14, color.Gray{0x80}, "No data")
		return
	}
	p := plot.New()
	p.BackgroundColor = color.Transparent
	p.X.Min, p.X.Max = float64(start.Unix()), float64(end.Unix())
	p.X.Tick.Marker = plot.TimeTicks{Format: "15:04", Ticker: plot.DefaultTicks{}}
	p.Y.Tick.Marker = unitTicks{unit}
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Tick.Label.Font.Size = 8
		a.Padding = 2
	}
	p.Y.Min = 0
	p.Legend.TextStyle.Font.Size = 8
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.Padding = 1
	yMax := 0.0
	for i, s := range ss {
		col := plotutil.Color(i)
		first := true
		var seg plotter.XYs
		flush := func() {
			if len(seg) == 0 {
				return
			}
			l, err := plotter.NewLine(seg)
			if err != nil {
				return
			}
			l.Color = col
			l.Width = vg.Points(1.5)
			p.Add(l)
			if first {
				p.Legend.Add(s.label, l)
				first = false
			}
			seg = nil
		}
		for j := range s.ts {
			if math.IsNaN(s.vs[j]) || math.IsInf(s.vs[j], 0) {
				flush()
				continue
			}
			seg = append(seg, plotter.XY{X: s.ts[j], Y: s.vs[j]})
			yMax = max(yMax, s.vs[j])
			if s.vs[j] < p.Y.Min {
				p.Y.Min = s.vs[j]
			}
		}
		flush()
		if first { // all NaN: still name it
			l, _ := plotter.NewLine(plotter.XYs{})
			if l != nil {
				l.Color = col
				p.Legend.Add(s.label+" (no values)", l)
			}
		}
	}
	if yMax == 0 {
		yMax = 1
	}
	p.Y.Max = yMax * 1.1
	// Room at the top for the title; the legend goes inside the plot area,
	// so leave it a band by lifting Y.Max.
	rows := len(ss)
	inner := draw.Crop(c, 4, -6, 4, -22)
	legendH := vg.Length(rows) * 10
	plotH := inner.Max.Y - inner.Min.Y
	if legendH > plotH*0.6 {
		legendH = plotH * 0.6
	}
	if frac := float64(legendH / plotH); frac < 0.9 {
		p.Y.Max = p.Y.Min + (p.Y.Max-p.Y.Min)/(1-frac)
	}
	p.Draw(inner)
}

type unitTicks struct{ unit string }

func (u unitTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = format(ts[i].Value, u.unit)
		}
	}
	return ts
}

// format writes v in Grafana's simple units.
func format(v float64, unit string) string {
	if math.IsNaN(v) {
		return "NaN"
	}
	switch unit {
	case "percentunit":
		return trim(v*100) + "%"
	case "percent":
		return trim(v) + "%"
	case "reqps":
		return short(v) + "/s"
	case "s":
		switch a := math.Abs(v); {
		case a == 0:
			return "0"
		case a < 1e-3:
			return trim(v*1e6) + " µs"
		case a < 1:
			return trim(v*1e3) + " ms"
		}
		return trim(v) + " s"
	case "bytes":
		for _, u := range []struct {
			n string
			f float64
		}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
			if math.Abs(v) >= u.f {
				return trim(v/u.f) + " " + u.n
			}
		}
		return trim(v) + " B"
	}
	return short(v)
}

func short(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e9:
		return trim(v/1e9) + " G"
	case a >= 1e6:
		return trim(v/1e6) + " M"
	case a >= 1e3:
		return trim(v/1e3) + " K"
	}
	return trim(v)
}

func trim(v float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	if s == "-0" {
		s = "0"
	}
	return s
}
