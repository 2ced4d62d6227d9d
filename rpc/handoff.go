package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sluicehq/sluice/rpc/internal/custody"
	"github.com/sluicehq/sluice/rpc/internal/handoff"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// The hand-off of key state between nodes lives in rpc/internal/handoff;
// this file holds its faces (HandOff, Pull) and the adapters that give the
// hand-off what it needs of the Server. Leave, which switches the routing
// view, is in leave.go.

// DefaultHandOffTimeout bounds how long a new owner waits for the keys
// that moved to it (pulling each on first touch meanwhile), and a graceful
// leave's hand-off, when ServerConfig.HandOffTimeout is 0.
const DefaultHandOffTimeout = 10 * time.Second

// handOffBatch is the most keys one HandOff request or Pull carries.
const handOffBatch = handoff.Batch

// maxStoreKeyBytes is the longest store key: a name and a key at their
// bounds, with the name's length prefix.
const maxStoreKeyBytes = MaxNameBytes + MaxKeyBytes + 2

// errLeaving refuses what a leaving node no longer takes.
var errLeaving = handoff.ErrLeaving

// newMover returns the hand-off of s's keys.
func (s *Server) newMover() *handoff.Mover {
	return handoff.New(handoff.Config{
		Self: s.name, Instance: s.instanceID,
		Store: s.store, Custody: s.custody, Replicas: s.replicas, Rings: s.rings,
		Node: handOffNode{s}, StandIns: standIns{s},
		Timeout: s.handOffTimeout, PullTimeout: s.forwardTimeout / 2,
		ReplicationFactor: s.replication.Factor, MaxKeyBytes: maxStoreKeyBytes,
		PeerIdentity: s.peerIdentity, Logger: s.log,
		Recopy: func(key []byte) {
			if s.replication.Factor > 0 {
				s.dirty.Add(key)
			}
		},
	})
}

// handOffNode is what the hand-off needs of the Server.
type handOffNode struct{ s *Server }

func (n handOffNode) View() handoff.View                { return n.s.view.Load().handOffView() }
func (n handOffNode) Leaving() bool                     { return n.s.leaving.Load() }
func (n handOffNode) MemberLeaving(member, inst string) { n.s.memberLeaving(member, inst) }

// standIns gives the hand-off the Server's stand-in windows.
type standIns struct{ s *Server }

func (w standIns) Take(key string) (window.State, bool)       { return w.s.takeStandIn(key) }
func (w standIns) Flush(ctx context.Context) map[string]error { return w.s.flushStandIns(ctx) }
func (w standIns) Pending() int64                             { return w.s.fbKeys.Load() }

// handOffView is v as the hand-off sees it: the ring and the peers'
// clients.
func (v *view) handOffView() handoff.View {
	return handoff.View{Ring: v.ring, Peer: func(member string) sluicev1.PeerServiceClient {
		if p := v.peers[member]; p != nil {
			return p.Client()
		}
		return nil
	}}
}

// settle makes sure key's state has arrived before this node, its new
// owner under v, decides it (see handoff.Mover.Settle); false when it has
// not (a pull failed).
func (s *Server) settle(ctx context.Context, v *view, mi *custody.MovingIn, key []byte) bool {
	return s.handoff.Settle(ctx, v.handOffView(), mi, key)
}

// instanceID returns this node's gossiped instance id ("" if unknown).
func (s *Server) instanceID() string {
	if p := s.instance.Load(); p != nil {
		return *p
	}
	return ""
}

// signalPush asks the push loop to hand off the keys this node holds but
// does not own; signals coalesce.
func (s *Server) signalPush() { s.handoff.Signal() }

// vetSender: see handoff.Mover.VetSender.
func (s *Server) vetSender(ctx context.Context, sender string) error {
	return s.handoff.VetSender(ctx, sender)
}

// HandOff implements PeerService.HandOff: it answers each request of the
// stream in order (see handoff.Mover.Receive; a request marked stand_in
// goes to mergeStandIns).
func (s *Server) HandOff(stream sluicev1.PeerService_HandOffServer) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp := s.handoff.Receive(stream.Context(), req, func(ctx context.Context, v handoff.View, req *sluicev1.HandOffRequest) (int64, string) {
			return s.mergeStandIns(ctx, v.Ring, req)
		})
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// Pull implements PeerService.Pull: it validates the request, naming the
// field, and gives up the keys the sender may pull (see
// handoff.Mover.GiveUp).
func (s *Server) Pull(ctx context.Context, req *sluicev1.PullRequest) (*sluicev1.PullResponse, error) {
	switch {
	case req.Sender == "":
		return nil, invalidArgument(&fieldError{"sender", "must not be empty"})
	case len(req.Keys) == 0 || len(req.Keys) > handOffBatch:
		return nil, invalidArgument(&fieldError{"keys", fmt.Sprintf("must hold 1..%d keys, got %d", handOffBatch, len(req.Keys))})
	}
	if err := s.handoff.VetPuller(ctx, req.Sender, len(req.Keys)); err != nil {
		return nil, err
	}
	for i, kb := range req.Keys {
		if len(kb) == 0 {
			return nil, invalidArgument(&fieldError{fmt.Sprintf("keys[%d]", i), "must not be empty"})
		}
	}
	return s.handoff.GiveUp(ctx, req.Sender, req.RingFingerprint, req.Keys, req.Relearn)
}
