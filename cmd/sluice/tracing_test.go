package main

import (
	"strings"
	"testing"
)

func TestTracingWanted(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
		warn string
	}{
		{nil, false, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, true, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}, true, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_TRACES_EXPORTER": "none"}, false, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, false, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, "OTEL_TRACES_EXPORTER=zipkin is not supported"},
	} {
		got, warn := tracingWanted(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
		if got != tc.want || !strings.Contains(warn, tc.warn) || (tc.warn == "" && warn != "") {
			t.Errorf("tracingWanted(%v) = %v, %q; want %v, %q", tc.env, got, warn, tc.want, tc.warn)
		}
	}
}

// With tracing asked for and no collector listening, a node still answers
// checks (spans are dropped, never checks) and stops on time.
func TestServeWithTracingAndNoCollector(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "500")
	addr, stop := startServe(t, "traced", []string{"--name", "traced", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--http-addr", "", "--profile", "local"},
		map[string]string{"OTEL_TRACES_EXPORTER": "otlp"})
	if code, _, stderr := sluice(t, "check", "--addr", addr, "--name", "api", "--key", "k", "--count", "3"); code != 0 {
		t.Fatalf("check with tracing on: exit %d %s", code, stderr)
	}
	code, log := stop()
	if code != 0 || !strings.Contains(log, "tracing RPCs with OpenTelemetry") {
		t.Fatalf("serve exited %d:\n%s", code, log)
	}
}
