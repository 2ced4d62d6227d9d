package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/window"
)

// Counts that survive a whole-cluster stop (NodeConfig.StateDir; the user's
// side is docs/persistence.md). The file's layout is in statefile.go.
//
// A node writes its state file
//
//   - when it leaves gracefully (Close) and no member can take its keys:
//     every other member is gone or leaving too, or it is the last one
//     (a "leave" file: the keys' only state, stand-in hits folded in);
//   - every StateInterval while it runs (a "snapshot", which also names the
//     processes of its ring's other members at the time).
//
// and removes it when it leaves gracefully and its keys went to other
// members (their state lives on there: a file would count it twice).
//
// A node starting with a state file puts the keys' states into its windows
// (window.Store.MergeState: counts add to what is there, and a window that
// has ended since counts nothing): a leave's file before it takes any
// check, and so a snapshot written while the node was alone. Any other
// snapshot waits until the node sees another member (a node started
// without Join serves meanwhile, from what it counts afresh): when one of
// the processes the snapshot names still runs, this node crashed alone and
// the others hold copies of its keys (replication) that stand in for it
// and come back to it, so the snapshot is dropped (applying it too would
// count those hits twice); when none does, the whole cluster went down
// together and the snapshot is applied. Either way the file is removed once
// used: it is never applied twice. Keys the restarted ring gives to another
// member move there as any held key does (the push loop after the ring
// changes, or the new owner's pull on first touch).

// stateDir is a node's state directory and what the node read there.
type stateDir struct {
	dir, path string
	log       *slog.Logger

	mu      sync.Mutex // serializes writes, removals and the settling of pending
	final   bool       // Close has written or removed the file: nothing more is written
	pending *stateFile // a snapshot read at start, neither applied nor dropped yet
	applied bool       // the file read at start was applied: removed once the node runs
}

// openStateDir creates cfg.StateDir when absent (0700), makes sure the node
// can write there, removes what an interrupted write left, and reads the
// node's state file (nil: none). A file that is not a state file, of
// another format version, corrupt, truncated or of another node is refused
// with an error naming the file: the node does not start (see
// docs/persistence.md for why).
func openStateDir(cfg NodeConfig, log *slog.Logger) (*stateDir, *stateFile, error) {
	if cfg.StateDir == "" {
		return nil, nil, nil
	}
	dir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, nil, fmt.Errorf("state_dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("state_dir: %w", err)
	}
	base := stateFileName(cfg.Name)
	removeTempFiles(dir, base)
	probe, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return nil, nil, fmt.Errorf("state_dir: %s is not writable: %w", dir, err)
	}
	probe.Close()
	_ = os.Remove(probe.Name())
	d := &stateDir{dir: dir, path: filepath.Join(dir, base), log: log.With("component", "state")}
	f, err := readStateFile(d.path)
	if err != nil {
		return nil, nil, fmt.Errorf("state_dir: %w; move it aside to start without the counts it holds", err)
	}
	if f != nil && f.node != cfg.Name {
		return nil, nil, fmt.Errorf("state_dir: state file %s: %w: written by node %q, this node is %q",
			d.path, ErrStateFile, f.node, cfg.Name)
	}
	return d, f, nil
}

// restoreState puts the state file f read at start (nil: none) into the
// node's windows, or keeps a snapshot that names other members for
// settleSnapshot. Called before the node serves.
func (n *Node) restoreState(f *stateFile) {
	d := n.state
	if d == nil || f == nil {
		return
	}
	if f.kind == stateSnapshot && len(f.peers) > 0 {
		d.pending = f
		d.log.Info("state snapshot read; applied once this node meets its cluster, unless processes that ran beside the one that wrote it still run",
			"file", d.path, "keys", len(f.keys), "written", f.written.UTC())
		return
	}
	n.applyState(f)
	d.applied = true
}

// stateStarted removes the state file applied at start, now that the node
// runs (a crash from here on must not apply it again: its keys may have
// moved, or been copied to other members, meanwhile).
func (n *Node) stateStarted() {
	d := n.state
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.applied {
		d.remove()
	}
}

// applyState merges f's states into the node's windows (skipping those
// whose window has ended) and marks them for replication.
func (n *Node) applyState(f *stateFile) {
	now := n.store.Now()
	applied, ended := 0, 0
	for i, k := range f.keys {
		st := f.states[i]
		if !st.Expires().After(now) {
			ended++
			continue
		}
		n.store.MergeState(k, st, now)
		if n.server.replication.Factor > 0 {
			n.server.dirty.Add([]byte(k))
		}
		applied++
	}
	if f.kind == stateLeave && n.server.leases != nil {
		// A graceful leave's file holds exactly what this node's region
		// admitted (it was its only member): its holders are not blind.
		n.server.leases.knowsState()
	}
	n.state.log.Info("state restored", "file", n.state.path, "kind", f.kind.String(), "keys", applied,
		"ended", ended, "written", f.written.UTC())
}

// settleSnapshot applies or drops the snapshot read at start once the
// member list ms (gossip's, this node included) holds another member:
// dropped when one of them is a process the snapshot names (this node
// crashed alone; their copies of its keys stand in), applied otherwise.
// Called before the ring of ms is built.
func (n *Node) settleSnapshot(ms []cluster.Member) {
	d := n.state
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.pending
	if f == nil || d.final {
		return
	}
	ran := map[peerInstance]bool{}
	for _, p := range f.peers {
		ran[p] = true
	}
	others := 0
	for _, m := range ms {
		if m.Name == n.cfg.Name {
			continue
		}
		others++
		if m.Instance != "" && ran[peerInstance{m.Name, m.Instance}] {
			d.pending = nil
			d.log.Warn("state snapshot not applied: a member that ran beside the process that wrote it still runs, and its copies of the keys stand in for them",
				"file", d.path, "member", m.Name, "keys", len(f.keys))
			d.remove()
			return
		}
	}
	if others == 0 {
		return // not met the cluster yet
	}
	d.pending = nil
	n.applyState(f)
	d.remove()
}

// SaveState writes a snapshot of this node's windows (and the hits it
// admitted in unreachable owners' stead) to its state file now, as it
// does every NodeConfig.StateInterval. It returns an error when the node
// has no StateDir, while a snapshot read at start is not settled yet (the
// node has not met its cluster: writing would replace it), once Close has
// begun, or when the write fails (the file then stays as it was).
func (n *Node) SaveState() error {
	d := n.state
	if d == nil {
		return errors.New("rpc: save state: no state dir")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.final || n.draining.Load():
		return errors.New("rpc: save state: the node is leaving")
	case d.pending != nil:
		return errors.New("rpc: save state: the snapshot read at start is not settled yet")
	}
	f := &stateFile{kind: stateSnapshot, written: time.Now(), node: n.cfg.Name, instance: n.cluster.Instance()}
	for _, m := range n.server.view.Load().members {
		if m.Name != n.cfg.Name {
			f.peers = append(f.peers, peerInstance{m.Name, m.Instance})
		}
	}
	f.keys, f.states = n.server.snapshotStates()
	if err := writeStateFile(d.path, f); err != nil {
		return fmt.Errorf("rpc: save state: %s: %w", d.path, err)
	}
	d.log.Debug("state snapshot written", "file", d.path, "keys", len(f.keys))
	return nil
}

// stateLoop writes a snapshot every StateInterval until ctx ends.
func (n *Node) stateLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.StateInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n.draining.Load() {
			return
		}
		n.state.mu.Lock()
		waiting := n.state.pending != nil
		n.state.mu.Unlock()
		if waiting {
			continue
		}
		if err := n.SaveState(); err != nil && !n.draining.Load() {
			n.log.Error("state snapshot not written; the last one stays", "error", err)
		}
	}
}

// keepState is Close's last word on the state file, once no call is in
// flight; leaveErr is the hand-off's error (nil: every key went). When no
// member could take the keys (this node was the last, or every other one
// was gone or leaving: the hand-off's ring had no members), it writes
// them; when they went to other members, it removes the file (its counts
// live on there); when the hand-off failed with members left, it removes
// the file too (their copies of the keys stand in once this node is gone;
// a file would count them twice), and says what it did not keep. A
// snapshot read at start and never settled stays as it is. A node the
// cluster refused (its name is taken) writes back what it restored.
func (n *Node) keepState(leaveErr error) {
	d := n.state
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.final = true
	if d.pending != nil {
		d.log.Warn("state snapshot read at start kept as it was: this node never met its cluster; what it counted since its start is not saved",
			"file", d.path, "keys", n.store.Len())
		return
	}
	s := n.server
	switch {
	case n.refused.Load() || s.noneCouldTake(leaveErr):
		s.foldStandIns()
		f := &stateFile{kind: stateLeave, written: time.Now(), node: n.cfg.Name, instance: n.cluster.Instance()}
		f.keys, f.states = s.liveStates()
		if len(f.keys) == 0 {
			d.remove()
			return
		}
		if err := writeStateFile(d.path, f); err != nil {
			d.log.Error("keys not saved: no member could take them, and the state file could not be written", "file", d.path, "keys", len(f.keys), "error", err)
			return
		}
		d.log.Info("keys saved for a restart: no member could take them", "file", d.path, "keys", len(f.keys))
	default:
		d.remove()
		if k := s.store.Len(); k > 0 {
			d.log.Warn("keys not saved: the hand-off failed while members remain, whose copies of the keys stand in", "keys", k)
		}
	}
}

// remove removes the state file (none: nothing to do). Requires mu.
func (d *stateDir) remove() {
	err := os.Remove(d.path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err == nil {
		err = syncDir(d.dir)
	}
	if err != nil {
		d.log.Error("state file not removed: a restart would apply it again", "file", d.path, "error", err)
	}
}

// noneCouldTake reports whether a leave's hand-off, whose error is
// leaveErr, ended because no member could take the keys: Leave found no
// other member (it leaves its view as it was, this node in its ring), or
// the ring of the members left to push to was empty, every other one gone
// or leaving too (ring.ErrNoMembers, wrapped). This is the one test of the
// leave path's "no one to take the keys" that keepState relies on.
func (s *Server) noneCouldTake(leaveErr error) bool {
	last := s.leaving.Load() && s.view.Load().ring.Has(s.name)
	return last || errors.Is(leaveErr, ring.ErrNoMembers) || errors.Is(leaveErr, ErrNoneToTake)
}

// foldStandIns adds every key's stand-in hits (what this node admitted in
// unreachable owners' stead and has not handed on) to its own window of
// the key: a leave no member could take them from keeps them so.
func (s *Server) foldStandIns() {
	now := s.store.Now()
	for _, k := range s.standInKeys() {
		if d, ok := s.takeStandIn(k); ok {
			s.store.MergeState(k, d, now)
		}
	}
}

// liveStates returns the keys of this node's windows and their states,
// leaving out those whose window has ended.
func (s *Server) liveStates() ([]string, []window.State) {
	now := s.store.Now()
	var keys []string
	var states []window.State
	for k, st := range s.store.All() {
		if st.Expires().After(now) {
			keys, states = append(keys, k), append(states, st)
		}
	}
	return keys, states
}

// snapshotStates is liveStates with each key's stand-in hits added (they
// stay in their fallback windows, to be handed on as usual).
func (s *Server) snapshotStates() ([]string, []window.State) {
	now := s.store.Now()
	standIn := map[string]window.State{}
	for _, k := range s.standInKeys() {
		if d, _, ok := s.standInHits(k, now); ok {
			standIn[k] = d
		}
	}
	ks, sts := s.liveStates()
	for i, k := range ks {
		if d, ok := standIn[k]; ok {
			sts[i] = window.Merge(sts[i], d)
			delete(standIn, k)
		}
	}
	for k, d := range standIn {
		ks, sts = append(ks, k), append(sts, d)
	}
	return ks, sts
}
