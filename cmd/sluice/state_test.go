package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// serve --state-dir (here from SLUICE_STATE_DIR): a node alone, stopped as
// SIGTERM stops it, writes its keys there; started again it goes on from
// them (a window of an hour has not ended meanwhile).
func TestServeStateDirKeepsCountsAcrossRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	env := map[string]string{
		"SLUICE_NAME": "state-node", "SLUICE_GRPC_ADDR": "127.0.0.1:0", "SLUICE_GOSSIP_ADDR": "127.0.0.1:0",
		"SLUICE_HTTP_ADDR": "", "SLUICE_PROFILE": "local", "SLUICE_STATE_DIR": dir, "SLUICE_STATE_INTERVAL": "1h",
	}
	checkKey := func(addr string, count string) string {
		t.Helper()
		code, out, errOut := sluice(t, "check", "--addr", addr, "--name", "api", "--key", "k", "--limit", "10", "--window", "1h", "--count", count)
		if code != 0 {
			t.Fatalf("check: exit %d %s", code, errOut)
		}
		return out
	}
	addr, stop := startServe(t, "state-node", nil, env)
	checkKey(addr, "4")
	if code, log := stop(); code != 0 || !strings.Contains(log, `msg="keys saved for a restart: no member could take them"`) {
		t.Fatalf("serve exited %d; want the keys saved in its log:\n%s", code, log)
	}
	if _, err := os.Stat(filepath.Join(dir, "state-node.state")); err != nil {
		t.Fatal(err)
	}
	addr, stop = startServe(t, "state-node", nil, env)
	defer stop()
	if out := checkKey(addr, "1"); !strings.Contains(out, "remaining=5 ") {
		t.Fatalf("after the restart: %s; want remaining=5 (4 counted before it, 1 now)", out)
	}
}

// A state file that does not read stops serve (exit 1), naming the file;
// --state-interval needs --state-dir and a duration >= 0.
func TestServeRefusesBadStateSettings(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "n1.state")
	if err := os.WriteFile(bad, []byte("SLUICEST\x00\x01garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"serve", "--name", "n1", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--http-addr", ""}
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--state-dir", dir}, 1, "state_dir: state file " + bad + ": bad state file: checksum mismatch"},
		{[]string{"--state-interval", "1m"}, 2, "--state-interval: needs --state-dir"},
		{[]string{"--state-dir", dir, "--state-interval", "-1s"}, 2, "--state-interval: must be >= 0"},
	} {
		code, _, errOut := sluice(t, append(base, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.msg) {
			t.Errorf("serve %v: exit %d, stderr %q; want exit %d saying %q", tc.args, code, errOut, tc.code, tc.msg)
		}
	}
}
