//go:build e2e && !linux

package e2e

import (
	"errors"
	"net/netip"
	"time"
)

// nfqueue needs Linux (netlink, network namespaces): elsewhere the WAN
// cannot be built, and the region tests say so.
type nfqueue struct{}

func openNfqueue(pid int, num uint16, delay time.Duration, drop func(netip.Addr) bool) (*nfqueue, error) {
	return nil, errors.New("nfqueue: needs Linux")
}

func (q *nfqueue) stats() string { return "" }

func (q *nfqueue) close() {}
