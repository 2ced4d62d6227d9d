package main

import (
	"strings"
	"testing"
)

// serve --help shows --allow-refunds, off by default, with its variable.
func TestServeHelpAllowRefunds(t *testing.T) {
	code, out, errOut := sluice(t, "serve", "--help")
	if code != 0 {
		t.Fatalf("serve --help: exit %d %s", code, errOut)
	}
	i := strings.Index(out, "--allow-refunds")
	if i < 0 {
		t.Fatalf("serve --help shows no --allow-refunds:\n%s", out)
	}
	line, _, _ := strings.Cut(out[i:], "\n")
	if !strings.Contains(line, "[$SLUICE_ALLOW_REFUNDS]") || !strings.Contains(line, "off by default") || strings.Contains(line, "(default: true)") {
		t.Errorf("serve --help: %q, want the flag off by default with SLUICE_ALLOW_REFUNDS", line)
	}
}
