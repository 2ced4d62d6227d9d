// Package e2e holds sluice's end-to-end fault suite: tests, behind the build
// tag e2e, that run a cluster of sluice containers with docker-compose
// (e2e/docker-compose.yml) and kill, stop, partition and scale its nodes
// under load, checking the hand-off accounting from outside the nodes.
//
// Run it with `make e2e` (which builds bin/sluice and the image sluice:e2e
// first) or `go test -tags e2e -v ./e2e`. Without the tag the package has
// no tests, so `go test ./...` needs no Docker. See the README, "The e2e
// fault suite".
package e2e
