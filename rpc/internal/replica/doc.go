// Package replica keeps the copies of keys' states on their owners'
// successors: an owner's [Replicator] sends the state of the keys it owns
// that changed (its [DirtySet]) to the members after it on the ring, and a
// successor keeps what it receives in its [Store], from which a key's new
// owner takes the copy over when the owner is gone.
//
// The package knows nothing of the node around it: the [Replicator] reads
// the ring, the windows and the members through the small interfaces
// [View], [Sender], [States] and [Counters], which the node implements.
// The receiving side (vetting a ReplicateRequest) is the node's; it puts
// what it accepts into the [Store] with [Store.Set].
//
// # Locks
//
// [Store] and [DirtySet] each hold 32 shard mutexes, one per shard of
// their keys. A shard lock is a leaf: while it is held the package takes
// no other lock and calls no callback and no interface: only pure code
// (a [ring.Ring]'s Owner and Has, a state's Expires). [Store.Orphans]
// calls its departed and instance callbacks with no shard lock held: it
// reads the owners of its copies under the shard locks, asks the
// callbacks about each owner with no lock held, and then takes the shard
// locks again to remove and return the copies. So a caller may call any
// method of [Store] and [DirtySet] while holding locks of its own, and
// the callbacks may take any lock. In the node's lock order these shard
// locks come last: the node calls [Store.Take] holding its decide gate and
// its hand-off mutex (hmu), and [Store.Get] holding its fallback mutex;
// its departed callback takes hmu. (Orphans once called departed with a
// shard lock held: a replica shard -> hmu edge, the reverse of a pull's
// hmu -> replica shard.)
//
// The [Replicator] holds no lock across a call to its interfaces; it takes
// the [DirtySet]'s shard locks (Drain, and Add after a failed send) and
// the [Store]'s (Sweep) only inside those methods.
package replica
