package rpc

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/internal/custody"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// holdingStream hands every message a server stream receives to hold
// before the handler sees it.
type holdingStream struct {
	grpc.ServerStream
	hold func(m any)
}

func (s holdingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.hold(m)
	}
	return err
}

// TestPullWaitsForAPushThatTookTheKeyAfterItsWait is the interleaving
// behind TestRollingReplacementKeepsCounts's "allowed 101 hits, want
// exactly 100": node1 holds a used-up key that node2 owns under the new
// ring. node2's first check of the key pulls it from node1, and node1's
// pull finds the key not on its way out; before the pull takes node1's
// gate, node1's push (its ring has changed) takes the key out and sends
// it to node2, where the test holds it. The pull must wait for that push:
// answered at once with no state, it lets node2 count the key as settled
// and decide the check from an empty window (allowed, 9 of 10 left), and
// the push adds the key's 10 hits only after (11 counted, one admitted
// beyond the limit).
func TestPullWaitsForAPushThatTookTheKeyAfterItsWait(t *testing.T) {
	clock := windowClock()
	var (
		armed                 atomic.Bool
		storeKey              string // set before armed
		atGate, proceed       = make(chan struct{}), make(chan struct{})
		pullWaits             = make(chan struct{})
		pushHeld, releasePush = make(chan struct{}), make(chan struct{})
		gateOnce, waitOnce    sync.Once
		pushOnce              sync.Once
	)
	c := newInproc(t)
	n1 := c.start(NodeConfig{Name: "node1", Clock: clock, ForwardTimeout: scenarioForwardTimeout,
		hooks: &testHooks{custody: &custody.Hooks{
			BeforeGiveUpGate: func(k string) {
				if armed.Load() && k == storeKey {
					gateOnce.Do(func() { close(atGate); <-proceed })
				}
			},
			Waiting: func(k string) {
				if armed.Load() && k == storeKey {
					waitOnce.Do(func() { close(pullWaits) })
				}
			},
		}}})
	holdPush := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if info.FullMethod == sluicev1.PeerService_HandOff_FullMethodName {
			ss = holdingStream{ServerStream: ss, hold: func(m any) {
				if req, ok := m.(*sluicev1.HandOffRequest); ok && armed.Load() && req.Sender == "node1" && len(req.States) > 0 {
					pushOnce.Do(func() { close(pushHeld); <-releasePush })
				}
			}}
		}
		return handler(srv, ss)
	}
	n2 := c.start(NodeConfig{Name: "node2", Clock: clock, ForwardTimeout: scenarioForwardTimeout,
		ServerOptions: []grpc.ServerOption{grpc.ChainStreamInterceptor(holdPush)}})
	s1, s2 := n1.Server(), n2.Server()
	both := c.members()
	alone := []cluster.Member{both[0]} // node1
	set := func(s *Server, ms []cluster.Member) {
		t.Helper()
		if err := s.SetMembers(ms); err != nil {
			t.Fatal(err)
		}
	}

	// node1 had node2 in its ring a moment (so that it takes node2's
	// pulls under that ring), and is alone again: it owns every key.
	set(s1, both)
	k := keyOwnedBy(t, n1, "pull", "node2")
	set(s1, alone)
	eventually(t, "node1's push loop to be done with the ring of both", func() bool {
		return s1.custody.LastPush() == s1.RingFingerprint()
	})
	rc := &sluicev1.RateLimitCheck{Name: "pull", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}
	for range 10 {
		if d := check(t, n1.client, rc); !d.Allowed || d.Owner != "node1" {
			t.Fatalf("hit at node1: %+v, want allowed by node1", d)
		}
	}
	// node2 has the ring of both: the key is its own, awaited from node1.
	set(s2, both)
	storeKey = string(ring.Key(nil, "pull", k))
	armed.Store(true)

	answer := make(chan *sluicev1.Decision, 1)
	go func() {
		resp, err := n2.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc}})
		if err != nil || len(resp.Decisions) != 1 {
			t.Errorf("the check at node2: %v %v", resp, err)
			answer <- nil
			return
		}
		answer <- resp.Decisions[0]
	}()
	<-atGate // node2's pull found the key at node1, not on its way out
	// node1's ring changes: its push takes the key out and sends it to
	// node2, which holds it.
	set(s1, both)
	<-pushHeld
	close(proceed)
	var d *sluicev1.Decision
	select {
	case d = <-answer: // answered while the key's count was held on its way
	case <-pullWaits: // the pull waits for the push
	}
	close(releasePush)
	if d == nil {
		d = <-answer
	}
	if d == nil {
		t.FailNow()
	}
	if d.Allowed || d.Remaining != 0 || d.Owner != "node2" || d.Degraded {
		t.Fatalf("the check at node2 while the key's push was on its way: %+v, want denied by node2, 0 left (node1 counted 10 of 10)", d)
	}
	for _, n := range []*inprocNode{n1, n2} {
		if p := peek(t, n.client, rc); p.Allowed || p.Remaining != 0 || p.Owner != "node2" {
			t.Errorf("peek via %s after the push: %+v, want node2 deciding, used up", n.Name(), p)
		}
	}
}
