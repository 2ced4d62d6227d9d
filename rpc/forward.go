package rpc

import (
	"slices"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/rpc/internal/forward"
)

// Defaults for BatchConfig.
const (
	DefaultBatchSize = forward.DefaultBatchSize
	DefaultBatchWait = forward.DefaultBatchWait
)

// BatchConfig shapes the queue of checks forwarded to one owner: a batch
// goes as soon as it holds MaxSize checks (default [DefaultBatchSize], at
// most [MaxBatch]), and at most MaxWait (default [DefaultBatchWait]) after
// its first check was queued, however small it is, when calls to the
// owner are in flight (with none in flight a check goes at once).
type BatchConfig = forward.BatchConfig

// A batch is a Forward call: the batcher's bound must be the receiver's.
const _ = uint(forward.MaxBatch-MaxBatch) + uint(MaxBatch-forward.MaxBatch)

// dialPeers returns the peers of the members ms and home (this node
// excluded; home are the home region's members, to which exact checks go
// from another region): a member's peer of old when its address is the
// same, else a new connection (a member that cannot be dialed is left
// out, and logged).
func (s *Server) dialPeers(old map[string]*forward.Peer, ms, home []cluster.Member) map[string]*forward.Peer {
	peers := make(map[string]*forward.Peer, len(ms)+len(home))
	cfg := forward.Config{Sender: s.name, Timeout: s.forwardTimeout, Batch: s.batch, Stats: s.peerStats}
	for i, m := range slices.Concat(ms, home) {
		cfg.View = s.ringStamp
		if i >= len(ms) {
			cfg.View = s.regionStamp(m.Region) // another region's members: their ring is their region's
		}
		if m.Name == s.name {
			continue
		}
		if p, ok := old[m.Name]; ok && p.Addr() == m.GRPCAddr {
			peers[m.Name] = p
			continue
		}
		cfg.DialOptions = s.dialOpts
		if s.peerCreds != nil {
			cfg.DialOptions = append(slices.Clone(s.dialOpts), grpc.WithTransportCredentials(s.peerCreds(m.Name)))
		}
		fp, err := forward.Dial(m.Name, m.GRPCAddr, cfg)
		if err != nil {
			s.log.Error("cannot connect to peer; leaving it out of the peer set", "peer", m.Name, "addr", m.GRPCAddr, "error", err)
			continue
		}
		peers[m.Name] = fp
	}
	return peers
}

// ringStamp returns the fingerprint and epoch of this node's ring now,
// which every forward carries.
func (s *Server) ringStamp() (fingerprint string, epoch uint64) {
	v := s.view.Load()
	return v.ring.Fingerprint(), v.epoch
}

// retire stops the peer's queue (failing what is queued) and closes its
// connection after grace, so that calls in flight can finish; Server.Close
// closes it at once.
func (s *Server) retire(p *forward.Peer, grace time.Duration) { s.retired.Retire(p, grace) }
