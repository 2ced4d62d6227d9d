package forward

import "google.golang.org/grpc"

// Conn returns the peer's connection, for the clients of the node's other
// peer services (the admin API's AdminPeerService), or nil for a peer made
// without one (tests' fakes).
func (p *Peer) Conn() grpc.ClientConnInterface {
	if p.conn == nil {
		return nil
	}
	return p.conn
}
