package console

import (
	"fmt"
	"html/template"
	"strings"
)

// Chart geometry: one bar per hour of the last day, oldest on the left.
const (
	chartBarWidth = 6
	chartGap      = 1
	chartHeight   = 36
)

// hourlyChart draws applied claims per hour (buckets[23]: the last) as
// inline SVG, which the CSP allows. Only numbers and fixed text go into the
// markup, so building it as text is safe.
func hourlyChart(buckets [24]int64) template.HTML {
	var peak int64
	for _, n := range buckets {
		peak = max(peak, n)
	}
	width := len(buckets) * (chartBarWidth + chartGap)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="applied per hour, last 24 hours (peak %d)">`,
		width, chartHeight+1, width, chartHeight+1, peak)
	fmt.Fprintf(&b, `<rect class="axis" x="0" y="%d" width="%d" height="1"></rect>`, chartHeight, width)
	for i, n := range buckets {
		h := 0
		if peak > 0 && n > 0 {
			h = max(1, int(n*chartHeight/peak))
		}
		ago := len(buckets) - 1 - i
		label := fmt.Sprintf("%d–%d h ago: %d applied", ago, ago+1, n)
		if ago == 0 {
			label = fmt.Sprintf("last hour: %d applied", n)
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d"><title>%s</title></rect>`,
			i*(chartBarWidth+chartGap), chartHeight-h, chartBarWidth, h, label)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // numbers and fixed text only, see above
}
