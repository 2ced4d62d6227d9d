package rpc

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// setBuild adds sluice_build_info{version,revision,goversion} 1 to m: which
// build the node runs (goversion: the Go that built this binary). Call it
// once, before m is served.
func (m *Metrics) setBuild(version, revision string) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "sluice_build_info",
		Help:        "Always 1; its labels say which build of sluice the node runs: version, revision (commit) and goversion.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": runtime.Version()},
	})
	g.Set(1)
	_ = m.reg.Register(g) // no other collector of m has the name
}
