package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/syncbuf"
)

// serve --rls-config refuses a bad rule file, naming the file and line,
// and serves ShouldRateLimit from a good one (here from SLUICE_RLS_CONFIG).
func TestServeRLSConfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minutes\n      requests_per_unit: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := sluice(t, "serve", "--name", "r", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--http-addr", "", "--rls-config", bad)
	if want := "invalid --rls-config: " + bad + `:5:13: descriptors[0].rate_limit.unit: invalid rate limit unit "minutes"`; code != exitUsage || !strings.Contains(errOut, want) {
		t.Fatalf("bad rules: exit %d, stderr %q; want exit 2 and %q", code, errOut, want)
	}

	env := map[string]string{
		"SLUICE_NAME": "rls-node", "SLUICE_GRPC_ADDR": "127.0.0.1:0", "SLUICE_GOSSIP_ADDR": "127.0.0.1:0", "SLUICE_HTTP_ADDR": "127.0.0.1:0",
		"SLUICE_PROFILE": "local", "SLUICE_RLS_CONFIG": "../../examples/rls",
	}
	getenv := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ctx, cancel := context.WithCancel(context.Background())
	var out, errBuf syncbuf.Buffer
	done := make(chan int)
	go func() { done <- run(ctx, []string{"sluice", "serve"}, getenv, &out, &errBuf) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop")
		}
	}()
	addrRe := regexp.MustCompile(`msg="node started" node=rls-node grpc_addr=(\S+)`)
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no start line:\n%s", errBuf.String())
		}
		if m := addrRe.FindStringSubmatch(errBuf.String()); m != nil {
			addr = m[1]
		}
	}
	if !strings.Contains(errBuf.String(), `msg="rls rules loaded" component=rls domains=edge files=1`) {
		t.Errorf("no rules line in the log:\n%s", errBuf.String())
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 10, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.7"}}}}}
	// 10 hits fill the per-minute limit of 10, the next is over it (once
	// more if a minute began in between).
	for try := 0; ; try++ {
		first, err := c.ShouldRateLimit(context.Background(), req)
		if err != nil || first.OverallCode != rlsv3.RateLimitResponse_OK || first.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("first: %v %v", first, err)
		}
		req.HitsAddend = 1
		second, err := c.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if second.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && second.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 10 {
			break
		}
		if try == 1 {
			t.Fatalf("second: %v, want OVER_LIMIT", second)
		}
		req.HitsAddend = 10
		req.Descriptors[0].Entries[0].Value = "203.0.113.8"
	}
}
