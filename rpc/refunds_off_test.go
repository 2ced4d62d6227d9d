package rpc

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// startRefundCluster starts one in-process node per allow (node1..nodeN,
// AllowRefunds allow[i], sharing a manual clock, an HTTP face each) and
// joins them.
func startRefundCluster(t *testing.T, allow ...bool) []*inprocNode {
	t.Helper()
	clock := windowClock()
	cfgs := make([]NodeConfig, len(allow))
	for i, on := range allow {
		cfgs[i] = NodeConfig{Name: fmt.Sprintf("node%d", i+1), Clock: clock, AllowRefunds: on, HTTPAddr: "127.0.0.1:0"}
	}
	return startInproc(t, cfgs...)
}

// Refunds are off by default (serve --allow-refunds): a check of negative
// hits is refused as before refunds existed, INVALID_ARGUMENT (HTTP 400)
// naming the field and the flag, alone or in a batch, all or nothing or
// not; nothing of the batch is counted, sluice_refunds_allowed is 0, and
// a node's own refunds of an all-or-nothing request still give back.
func TestRefundsOff(t *testing.T) {
	n := startRefundCluster(t, false)[0]
	rc := &sluicev1.RateLimitCheck{Name: "off", Key: "k", Limit: 10, WindowMs: time.Hour.Milliseconds(), Hits: proto.Int64(3)}
	check(t, n.client, rc)
	ok := proto.CloneOf(rc)
	ok.Key = "other"
	for _, tc := range []struct {
		name string
		req  *sluicev1.CheckRequest
		want string
	}{
		{"alone", &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{refundCheck(rc, 1)}}, "checks[0].hits: must be >= 0, got -1"},
		{"second of a batch", &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{ok, refundCheck(rc, 2)}}, "checks[1].hits: must be >= 0, got -2"},
		{"all or nothing", &sluicev1.CheckRequest{AllOrNothing: true, Checks: []*sluicev1.RateLimitCheck{refundCheck(rc, 3), ok}}, "checks[0].hits: must be >= 0, got -3"},
	} {
		_, err := n.client.Check(context.Background(), tc.req)
		want := tc.want + " (refunds are off: serve --allow-refunds)"
		if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != want {
			t.Errorf("%s: %v, want INVALID_ARGUMENT %q", tc.name, err, want)
		}
	}
	code, out := n.httpDo(t, "POST", "http://"+n.HTTPAddr()+"/v1/check",
		`{"checks":[{"name":"off","key":"k","limit":10,"window_ms":3600000,"hits":-2}]}`)
	var st struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != http.StatusBadRequest || st.Code != int(codes.InvalidArgument) ||
		st.Message != "checks[0].hits: must be >= 0, got -2 (refunds are off: serve --allow-refunds)" {
		t.Errorf("POST /v1/check hits -2: %d %s, want 400 naming checks[0].hits and the flag", code, out)
	}
	if d := peek(t, n.client, rc); d.Remaining != 7 {
		t.Errorf("after the refused refunds: remaining %d, want 7 (nothing given back)", d.Remaining)
	}
	if d := peek(t, n.client, ok); d.Remaining != 10 {
		t.Errorf("the batch's other check: remaining %d, want 10 (nothing counted)", d.Remaining)
	}
	// A node's refund of an all-or-nothing request is no client's.
	full := &sluicev1.RateLimitCheck{Name: "off", Key: "full", Limit: 1, WindowMs: time.Hour.Milliseconds(), Hits: proto.Int64(2)}
	resp, err := n.client.Check(context.Background(), &sluicev1.CheckRequest{AllOrNothing: true, Checks: []*sluicev1.RateLimitCheck{ok, full}})
	if err != nil || !resp.Decisions[0].Refunded || resp.Decisions[1].Allowed {
		t.Fatalf("all or nothing with refunds off: %v %v, want the first given back", resp.GetDecisions(), err)
	}
	if d := peek(t, n.client, ok); d.Remaining != 10 {
		t.Errorf("after the all-or-nothing refund: remaining %d, want 10", d.Remaining)
	}
	if st := n.srv.Stats(); st.AllowRefunds || st.RefundsRefused != 0 || st.Refunds != 1 {
		t.Errorf("Stats: AllowRefunds %v RefundsRefused %d Refunds %d, want false 0 1", st.AllowRefunds, st.RefundsRefused, st.Refunds)
	}
	if _, m := n.httpDo(t, "GET", "http://"+n.HTTPAddr()+"/metrics", ""); !strings.Contains(m, "\nsluice_refunds_allowed 0\n") {
		t.Errorf("/metrics: no sluice_refunds_allowed 0")
	}
}

// Nodes whose --allow-refunds differ: a refund let in by a node whose
// refunds are on is not applied by the key's owner whose refunds are off
// (answered with an error naming it and the flag, counted in
// sluice_refunds_refused_total there); the owner refuses one sent to it
// directly; a refund whose owner takes them is applied whichever node it
// entered, and sluice_refunds_allowed tells the nodes apart.
func TestRefundsMismatch(t *testing.T) {
	nodes := startRefundCluster(t, true, false)
	key := keyOwnedBy(t, nodes[0], "mix", "node2")
	rc := &sluicev1.RateLimitCheck{Name: "mix", Key: key, Limit: 10, WindowMs: time.Hour.Milliseconds(), Hits: proto.Int64(6)}
	check(t, nodes[0].client, rc)
	resp, err := nodes[0].client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{refundCheck(rc, 4)}})
	if err != nil {
		t.Fatal(err)
	}
	d := resp.Decisions[0]
	if d.Allowed || d.Refunded || !strings.Contains(d.Error, "refunds are off at node2") || !strings.Contains(d.Error, "--allow-refunds") {
		t.Fatalf("a refund through node1 (on) of node2's key (off): %v, want an error naming node2 and the flag", d)
	}
	if d := peek(t, nodes[0].client, rc); d.Remaining != 4 {
		t.Fatalf("after it: remaining %d, want 4 (not given back)", d.Remaining)
	}
	if st := nodes[1].srv.Stats(); st.RefundsRefused != 1 || st.Refunds != 0 {
		t.Fatalf("node2: RefundsRefused %d Refunds %d, want 1 0", st.RefundsRefused, st.Refunds)
	}
	if _, err := nodes[1].client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{refundCheck(rc, 4)}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a refund sent to node2: %v, want INVALID_ARGUMENT", err)
	}
	// A key of node1's: node1 takes refunds; node2 still refuses to let
	// one in.
	mine := proto.CloneOf(rc)
	mine.Key = keyOwnedBy(t, nodes[0], "mix", "node1")
	check(t, nodes[1].client, mine)
	if _, err := nodes[1].client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{refundCheck(mine, 6)}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a refund of node1's key sent to node2: %v, want INVALID_ARGUMENT", err)
	}
	if d := check(t, nodes[0].client, refundCheck(mine, 6)); !d.Refunded || d.Remaining != 10 || d.Owner != "node1" {
		t.Fatalf("a refund of node1's key sent to node1: %v, want 10 remaining", d)
	}
	for i, want := range []string{"\nsluice_refunds_allowed 1\n", "\nsluice_refunds_allowed 0\n"} {
		_, m := nodes[i].httpDo(t, "GET", "http://"+nodes[i].HTTPAddr()+"/metrics", "")
		if !strings.Contains(m, want) {
			t.Errorf("node%d /metrics: want %q", i+1, strings.TrimSpace(want))
		}
		if i == 1 && !strings.Contains(m, "\nsluice_refunds_refused_total 1\n") {
			t.Errorf("node2 /metrics: want sluice_refunds_refused_total 1")
		}
	}
}
