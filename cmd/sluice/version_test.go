package main

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/buildinfo"
)

// sluice --version (and -v) prints the build: the version, the revision
// and the Go version, nothing else.
func TestVersionFlag(t *testing.T) {
	for _, flag := range []string{"--version", "-v"} {
		code, out, errOut := sluice(t, flag)
		if code != 0 || errOut != "" {
			t.Fatalf("sluice %s: exit %d, stderr %q", flag, code, errOut)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if out != build.String() || len(lines) != 3 || lines[0] != "sluice "+build.Version ||
			!strings.HasPrefix(lines[1], "revision ") || !strings.HasPrefix(lines[2], runtime.Version()+" ") {
			t.Fatalf("sluice %s printed %q, want the build's three lines %q", flag, out, build.String())
		}
	}
}

// The Makefile stamps this package's version and revision: a name it
// gives -X that this package does not have would be dropped silently by
// the linker.
func TestMakefileStampsThisPackagesVariables(t *testing.T) {
	_ = []*string{&version, &revision} // both are string variables of package main
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`-X main\.(\w+)=`).FindAllStringSubmatch(string(b), -1) {
		names = append(names, m[1])
	}
	slices.Sort(names)
	if want := []string{"revision", "version"}; !slices.Equal(slices.Compact(names), want) {
		t.Fatalf("the Makefile stamps main.%v, want main.%v", names, want)
	}
}

// serve gossips its build's version (the members list it) and exports
// sluice_build_info{version,revision,goversion} 1 on /metrics.
func TestServeGossipsAndExportsItsBuild(t *testing.T) {
	old := build
	build = buildinfo.Info{Version: "v1.2.3-test", Revision: "0123abcd", GoVersion: runtime.Version()}
	t.Cleanup(func() { build = old })
	_, found, stop := startServeLog(t, []string{"--name", "built", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0",
		"--http-addr", "127.0.0.1:0", "--profile", "local"}, nil,
		regexp.MustCompile(`msg="node started" node=built grpc_addr=(\S+) gossip_addr=\S+ http_addr=(\S+)`))
	defer stop()
	grpcAddr, httpAddr := found[0][1], found[0][2]

	code, out, errOut := sluice(t, "members", "--addr", grpcAddr, "--json")
	if code != 0 || !strings.Contains(out, `"name":"built"`) || !strings.Contains(out, `"version":"v1.2.3-test"`) {
		t.Fatalf("members --json: exit %d %s %s, want version v1.2.3-test", code, out, errOut)
	}
	code, out, _ = sluice(t, "members", "--addr", grpcAddr)
	if code != 0 || !regexp.MustCompile(`(?m)^NAME .* VERSION\n.*built \(answering\) .* v1\.2\.3-test\n`).MatchString(out) {
		t.Fatalf("members: exit %d, want a VERSION column:\n%s", code, out)
	}

	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	want := `sluice_build_info{goversion="` + runtime.Version() + `",revision="0123abcd",version="v1.2.3-test"} 1` + "\n"
	if !strings.Contains(string(body), want) {
		t.Fatalf("/metrics lacks %q", want)
	}
}

// Every line serve logs names the node (node=), its own (shutting down,
// limits, rls, debug endpoints) as well as the node's.
func TestServeLogLinesNameTheNode(t *testing.T) {
	buf, _, stop := startServeLog(t, []string{"--name", "lognode", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0",
		"--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0", "--profile", "local", "--log-level", "debug",
		"--limits", "../../examples/limits.yaml", "--rls-config", "../../examples/rls"}, nil,
		regexp.MustCompile(`msg="node started"`), regexp.MustCompile(`msg="debug endpoints up"`))
	if code, log := stop(); code != 0 {
		t.Fatalf("serve exited %d:\n%s", code, log)
	}
	var lines int
	for _, l := range strings.Split(buf.String(), "\n") {
		if !strings.HasPrefix(l, "time=") {
			continue
		}
		lines++
		if !strings.Contains(l, " node=lognode") {
			t.Errorf("a line without node=: %s", l)
		}
	}
	for _, want := range []string{`msg="rls rules loaded"`, `msg="shutting down"`, `msg="node stopped"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log lacks %s", want)
		}
	}
	if lines < 10 {
		t.Fatalf("%d log lines, want the node's whole life at debug:\n%s", lines, buf.String())
	}
}
