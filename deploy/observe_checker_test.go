package deploy

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a reporter that keeps what it was told.
type recorder struct{ errs []string }

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// The checker of TestObservability reports each kind of mistake an
// expression can make against the series it knows, and passes correct
// ones (so a passing TestObservability means something).
func TestCheckerFindsMistakes(t *testing.T) {
	known := series{}
	known.add("sluice_checks_total", map[string]string{"name": "api", "outcome": "denied"})
	known.add("sluice_checks_total", map[string]string{"name": "api", "outcome": "allowed"})
	known.add("sluice_members", nil)
	known.add("sluice_node_info", map[string]string{"member": "node1", "region": "eu"})
	known.add("sluice_forward_duration_seconds_bucket", map[string]string{"le": "0.1"})
	for _, tc := range []struct {
		expr string
		want string // "" when correct, else a part of the one error
	}{
		{`sum by (name) (rate(sluice_checks_total{outcome="denied", instance=~".*"}[5m]))`, ""},
		{`sluice_checks_total{outcome=~"denied|allowed"}`, ""},
		{`sluice_members * on (job, instance) group_left (region) sluice_node_info < 3`, ""},
		{`histogram_quantile(0.99, sum by (job, le) (rate(sluice_forward_duration_seconds_bucket[5m]))) > 0.25`, ""},
		{`count by (job) (count_values by (job) ("n", sluice_members)) > 1`, ""},
		{`rate(sluice_check_total[5m])`, "sluice_check_total: no such metric"},
		{`sluice_checks_total{result="denied"}`, "has no label result"},
		{`sluice_checks_total{outcome="refused"}`, `{outcome="refused"} was never seen`},
		{`sluice_checks_total{outcome=~"denied|refused"}`, `{outcome="refused"} was never seen`},
		{`sum by (peer) (sluice_checks_total)`, "sum by (peer): no such label"},
		{`sluice_members * on (job, region) sluice_node_info`, "on (region): not on both sides"},
		{`sluice_members * on (job, instance) group_left (zone) sluice_node_info`, "group_left (zone): not on"},
		{`histogram_quantile(0.9, sum by (job) (rate(sluice_forward_duration_seconds_bucket[5m])))`, "histogram_quantile of series without le"},
		{`sum(rate(sluice_checks_total[5m]`, "does not parse"},
	} {
		r := &recorder{}
		c := &checker{t: r, where: "case", known: known, used: map[string]bool{}}
		c.check(tc.expr)
		switch {
		case tc.want == "" && len(r.errs) > 0:
			t.Errorf("%s: %v, want no error", tc.expr, r.errs)
		case tc.want != "" && (len(r.errs) != 1 || !strings.Contains(r.errs[0], tc.want)):
			t.Errorf("%s: %q, want one error with %q", tc.expr, r.errs, tc.want)
		}
	}
}
