package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/scenario"
)

// smokeScenario is 3 regions flooding one key with 10 checks each at the
// start of the run's second window, against a limit of 10 per 500 ms.
const smokeScenario = `
name: smoke
regions: [{name: us-east}, {name: eu-west}, {name: ap-south}]
rtt: 100ms
limit: {name: smoke, limit: 10, window: 500ms, scope: exact}
keys: {count: 1}
windows: 2
arrivals:
  - region: "*"
    floods: [{window: 1, checks: 10}]
`

func writeScenario(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The command runs a scenario against a real node standing for all
// three regions (one owner: exact whatever the scope) and reports what
// it admitted against the oracle.
func TestScenarioCommand(t *testing.T) {
	n := startNode(t, "scn")
	a := n.GRPCAddr()
	regions := "us-east=" + a + ",eu-west=" + a + ",ap-south=" + a
	file := writeScenario(t, smokeScenario)
	code, out, errOut := sluice(t, "scenario", "--file", file, "--region", regions, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errOut, out)
	}
	var rep scenario.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	tt := rep.Totals
	if tt.Checks != 30 || tt.Admitted != 10 || tt.OracleAdmitted != 10 || tt.Over != 0 || tt.Errors != 0 ||
		tt.Denied != 20 || !rep.BoundOK || rep.Scope != "exact" || len(rep.Regions) != 3 || tt.P50Ms <= 0 || tt.MessagesPerCheck != -1 {
		t.Fatalf("report %+v", rep)
	}
	if len(rep.Windows) != 1 || rep.Windows[0].Window != 1 || rep.Windows[0].Admitted != 10 {
		t.Fatalf("rows %+v", rep.Windows)
	}

	// Text, and --scope overriding the file's; the node knows no scopes
	// yet and decides as one owner, within regional's bound.
	code, out, errOut = sluice(t, "scenario", "--file", file, "--region", regions, "--scope", "regional")
	if code != 0 || !strings.Contains(out, "scenario smoke: 3 regions, fixed_window 10 per 500ms, scope regional, 1 keys") ||
		!strings.Contains(out, "over-admission 0 hits (max 0, bound 20: ok)") {
		t.Fatalf("exit %d: %s\n%s", code, errOut, out)
	}

	// Cuts: refused, or run without them when told so.
	cut := writeScenario(t, smokeScenario+"cuts: [{region: ap-south, from: 0s, to: 500ms}]\n")
	code, _, errOut = sluice(t, "scenario", "--file", cut, "--region", regions)
	if code != 2 || !strings.Contains(errOut, "--ignore-cuts") || !strings.Contains(errOut, "ap-south from 0s to 500ms") {
		t.Fatalf("cuts: exit %d: %s", code, errOut)
	}
	code, out, errOut = sluice(t, "scenario", "--file", cut, "--region", regions, "--ignore-cuts", "--json")
	if code != 0 || !strings.Contains(errOut, "warning: cuts not enforced") || !strings.Contains(out, `"cuts_enforced":false`) {
		t.Fatalf("--ignore-cuts: exit %d: %s\n%s", code, errOut, out)
	}

	// Restarts: refused, or run without them when told so (at once, mid-window).
	rs := writeScenario(t, smokeScenario+"restarts: [{region: eu-west, at: 100ms, how: kill}]\n")
	code, _, errOut = sluice(t, "scenario", "--file", rs, "--region", regions)
	if code != 2 || !strings.Contains(errOut, "--ignore-restarts") || !strings.Contains(errOut, "eu-west node 0 at 100ms") {
		t.Fatalf("restarts: exit %d: %s", code, errOut)
	}
	code, out, errOut = sluice(t, "scenario", "--file", rs, "--region", regions, "--ignore-restarts", "--start-now", "--json")
	if code != 0 || !strings.Contains(errOut, "warning: restarts not enforced") || !strings.Contains(out, `"restarts_enforced":false`) {
		t.Fatalf("--ignore-restarts: exit %d: %s\n%s", code, errOut, out)
	}
}

// --simulate replays a scenario's restarts: a region's only node killed
// and started again under its name, mid-window; its region's checks fail
// while it is down, and the report says when it was back.
func TestScenarioCommandSimulatesRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster for about 10 s")
	}
	file := writeScenario(t, `
name: restart
regions: [{name: ra}, {name: rb}, {name: rc}]
rtt: 20ms
limit: {name: restart, limit: 30, window: 1h}
keys: {count: 2}
duration: 6s
arrivals: [{region: "*", rate: 10}]
restarts: [{region: rb, at: 1s, how: kill, down: 1s}]
`)
	code, out, errOut := sluice(t, "scenario", "--simulate", "--start-now", "--file", file, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errOut, out)
	}
	var rep scenario.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !rep.RestartsEnforced || len(rep.Restarts) != 1 || rep.Restarts[0].Region != "rb" || rep.Restarts[0].How != "kill" ||
		rep.Restarts[0].BackMs < 2000 || rep.Regions[1].Errors == 0 || rep.Totals.Over != 0 {
		t.Fatalf("report %+v", rep)
	}
}

// Bad input is refused with exit 2, naming the flag (and the field).
func TestScenarioCommandRefuses(t *testing.T) {
	file := writeScenario(t, smokeScenario)
	all := "us-east=127.0.0.1:1,eu-west=127.0.0.1:1,ap-south=127.0.0.1:1"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--region", all}, "--file: required"},
		{[]string{"--file", filepath.Join(t.TempDir(), "none.yaml"), "--region", all}, "--file"},
		{[]string{"--file", writeScenario(t, strings.Replace(smokeScenario, "limit: 10", "limit: -1", 1)), "--region", all}, "limit.limit"},
		{[]string{"--file", file, "--region", "us-east=127.0.0.1:1"}, "no address for region eu-west, ap-south"},
		{[]string{"--file", file, "--region", all + ",mars=127.0.0.1:1"}, `"mars" is not a region`},
		{[]string{"--file", file, "--region", all + ",us-east"}, "is not REGION=H:P"},
		{[]string{"--file", file, "--region", all + ",us-east=nohost"}, "not host:port"},
		{[]string{"--file", file, "--region", all, "--scope", "planet"}, "--scope"},
		{[]string{"--file", file, "--region", all, "--concurrency", "0"}, "--concurrency"},
		{[]string{"--file", file, "--region", all, "--settle"}, "--settle apply to --simulate only"},
	} {
		code, _, errOut := sluice(t, append([]string{"scenario"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %s (want 2 and %q)", tc.args, code, errOut, tc.want)
		}
	}
}

// Two separate clusters of one node, as two regions of a global limit,
// each enforce the whole limit: the report catches the over-admission and
// the command exits 1.
func TestScenarioCommandCatchesOverAdmission(t *testing.T) {
	n1, n2 := startNode(t, "scn-a"), startNode(t, "scn-b")
	file := writeScenario(t, `
name: split
regions: [{name: a}, {name: b}]
limit: {name: split, limit: 10, window: 500ms, scope: global}
keys: {count: 1}
windows: 2
arrivals: [{region: "*", floods: [{window: 1, checks: 10}]}]
`)
	code, out, errOut := sluice(t, "scenario", "--file", file, "--region", "a="+n1.GRPCAddr()+",b="+n2.GRPCAddr())
	if code != 1 || !strings.Contains(errOut, "over-admission above the scope's bound") ||
		!strings.Contains(out, "over-admission 10 hits (max 10, bound 0: VIOLATED (key k0 window 1))") {
		t.Fatalf("exit %d: %s\n%s", code, errOut, out)
	}
}
