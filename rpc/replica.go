package rpc

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/internal/forward"
	"github.com/sluicehq/sluice/rpc/internal/replica"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// Defaults for ReplicationConfig.
const (
	DefaultReplicationFactor   = replica.DefaultFactor
	DefaultReplicationInterval = replica.DefaultInterval
)

// ReplicationConfig shapes the copies each owner keeps of its keys on the
// next members of the ring: Factor (the number of extra copies, on the
// members that follow its owner on the ring; default 1, negative turns
// replication off), Disabled (replication off, as a negative Factor) and
// Interval (how often an owner sends the keys that changed since the last
// send; a crashed owner loses at most the hits it admitted in the last
// Interval plus the duration of one send, bounded by the forward timeout;
// default 100 ms). All optional.
type ReplicationConfig = replica.Config

// replicateLoop sends copies of the keys this node owns to their
// successors until ctx is done (see replica.Replicator).
func (s *Server) replicateLoop(ctx context.Context) {
	replica.NewReplicator(replica.ReplicatorConfig{
		Self:        s.name,
		Instance:    s.instanceID,
		Replication: s.replication,
		Batch:       handOffBatch, // what Replicate takes
		Timeout:     s.forwardTimeout,
		View:        replicaView{s},
		States:      s.store,
		Counters:    replicaCounters{&s.stats},
		Dirty:       s.dirty,
		Copies:      s.replicas,
		OnSweep:     s.custody.SweepTakenOver,
		Log:         s.log,
	}).Run(ctx)
}

// replicaView is replica.View: the ring and peers of s's current view.
type replicaView struct{ s *Server }

func (rv replicaView) Current() (*ring.Ring, replica.Sender, bool) {
	v := rv.s.view.Load()
	if rv.s.leaving.Load() {
		return nil, nil, false
	}
	return v.ring, replicaPeers{v.peers}, true
}

// replicaPeers is replica.Sender over the peers of one view.
type replicaPeers struct{ peers map[string]*forward.Peer }

func (rp replicaPeers) Replicate(ctx context.Context, member string, req *sluicev1.ReplicateRequest) error {
	p := rp.peers[member]
	if p == nil {
		return errors.New("no connection")
	}
	_, err := p.Client().Replicate(ctx, req)
	return err
}

// replicaCounters is replica.Counters over s's counters.
type replicaCounters struct{ c *counters }

func (rc replicaCounters) Replicated(n int) { rc.c.replicated.Add(int64(n)) }
func (rc replicaCounters) Behind(n int)     { rc.c.replicaBehind.Add(int64(n)) }

// Replicate implements PeerService.Replicate: each state replaces this
// node's copy of the key.
func (s *Server) Replicate(ctx context.Context, req *sluicev1.ReplicateRequest) (*sluicev1.ReplicateResponse, error) {
	switch {
	case req.Sender == "":
		return nil, invalidArgument(&fieldError{"sender", "must not be empty"})
	case len(req.States) > handOffBatch:
		return nil, invalidArgument(&fieldError{"states", fmt.Sprintf("at most %d per request, got %d", handOffBatch, len(req.States))})
	}
	states := make([]window.State, len(req.States))
	keys := make([][]byte, len(req.States))
	for i, ks := range req.States {
		keys[i] = ks.GetKey()
		if len(ks.GetKey()) == 0 {
			return nil, invalidArgument(&fieldError{fmt.Sprintf("states[%d].key", i), "must not be empty"})
		}
		if err := states[i].UnmarshalBinary(ks.GetState()); err != nil {
			return nil, invalidArgument(&fieldError{fmt.Sprintf("states[%d].state", i), err.Error()})
		}
	}
	if s.leaving.Load() {
		return &sluicev1.ReplicateResponse{}, nil
	}
	instance := req.SenderInstance
	if instance == "" {
		instance = s.memberInstance(req.Sender)
	}
	s.replicas.SetAll(keys, req.Sender, instance, states)
	return &sluicev1.ReplicateResponse{}, nil
}
