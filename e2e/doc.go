// Package e2e holds sluice's end-to-end fault suite: tests, behind the build
// tag e2e, that run a cluster of sluice containers with docker-compose
// (e2e/docker-compose.yml) and kill, stop, partition and scale its nodes
// under load, checking the hand-off accounting from outside the nodes.
// The region tests (regions_test.go) run three regions of one or two nodes
// each (e2e/docker-compose.regions.yml) with a WAN between them built from
// the host (wan_test.go: tc netem, or an iptables NFQUEUE that the test
// serves, in each container's network namespace; they need root and fail
// when it cannot be built), and measure package scenario's scenarios
// against the nodes.
//
// Run it with `make e2e` (which builds bin/sluice and the image sluice:e2e
// first) or `go test -tags e2e -v ./e2e`. Without the tag the package has
// no tests, so `go test ./...` needs no Docker. See docs/containers.md, "The e2e
// fault suite".
package e2e
