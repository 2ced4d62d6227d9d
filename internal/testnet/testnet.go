// Package testnet gives tests loopback addresses that fail the ways a
// peer's host does: nothing listening, or a listener that never answers.
// It imports nothing of sluice, so the tests of every package (rpc's own
// included) can use it. Tests only.
package testnet

import (
	"net"
	"sync"
	"testing"
)

// DeadAddr returns a loopback host:port nothing listens on (a node that is
// down: connections are refused).
func DeadAddr(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// SilentAddr returns a loopback host:port that accepts connections and
// never answers (a hung node), until the test ends.
func SilentAddr(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	Silent(t, lis)
	return lis.Addr().String()
}

// Silent makes lis accept connections and never answer (a hung node, or
// a host behind a firewall that drops packets) until the test ends, when
// it closes lis and the connections it accepted. lis may be any listener
// (a TCP one, gRPC's bufconn).
func Silent(t testing.TB, lis net.Listener) {
	t.Helper()
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
}
