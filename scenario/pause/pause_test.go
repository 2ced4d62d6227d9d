//go:build unix

package pause

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// The test runs for minutes (a repetition takes 10-20 s), so it runs only
// when SLUICE_PAUSE is set; plain `go test ./...` skips it.
const enableEnv = "SLUICE_PAUSE"

const (
	limit      = 40        // hits per window of every key
	windowMs   = 3_600_000 // an hour: nothing expires during a run
	keysPerRep = 4         // fresh keys owned by the paused node, per repetition
	spent      = 10        // hits spent on each key before the pause
	idle       = 1500 * time.Millisecond
	resumeFor  = 4 * time.Second
	inflight   = 160 // checks in flight at most
	maxChecks  = 2000
)

// bin is the sluice binary TestMain built.
var bin string

func TestMain(m *testing.M) {
	if os.Getenv(enableEnv) == "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "sluice-pause-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	bin = filepath.Join(dir, "sluice")
	build := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
	build.Dir = filepath.Join("..", "..") // the module root, from scenario/pause
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/sluice: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(2)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func envDuration(t *testing.T, key string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return d
}

func envString(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// node is one `sluice serve` process.
type node struct {
	name                           string
	cmd                            *exec.Cmd
	grpcAddr, gossipAddr, httpAddr string
	logPath                        string
	conn                           *grpc.ClientConn
	rl                             sluicev1.RateLimitServiceClient
}

func (n *node) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(n.cmd.Process.Pid, sig); err != nil {
		t.Fatalf("kill -%v %s: %v", sig, n.name, err)
	}
}

var started = regexp.MustCompile(`msg="node started" node=(\S+) grpc_addr=(\S+) gossip_addr=(\S+) http_addr=(\S+)`)

// startNode starts `sluice serve` with OS-picked ports and waits (15 s at
// most) for its "node started" line. The process is killed at cleanup
// (SIGCONT first, in case it is stopped).
func startNode(t *testing.T, logDir, name, join string, flags []string) *node {
	t.Helper()
	n := &node{name: name, logPath: filepath.Join(logDir, name+".log")}
	f, err := os.Create(n.logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"serve", "--name", name, "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}
	if join != "" {
		args = append(args, "--join", join)
	}
	n.cmd = exec.Command(bin, append(args, flags...)...)
	n.cmd.Stdout, n.cmd.Stderr = f, f
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	t.Cleanup(func() {
		_ = n.cmd.Process.Signal(syscall.SIGCONT)
		_ = n.cmd.Process.Kill()
		_ = n.cmd.Wait()
		if n.conn != nil {
			_ = n.conn.Close()
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		b, _ := os.ReadFile(n.logPath)
		if m := started.FindSubmatch(b); m != nil && string(m[1]) == name {
			n.grpcAddr, n.gossipAddr, n.httpAddr = string(m[2]), string(m[3]), string(m[4])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not start:\n%s", name, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.conn, err = grpc.NewClient(n.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	n.rl = sluicev1.NewRateLimitServiceClient(n.conn)
	return n
}

// members is the names in n's ring (Members: alive and suspect members),
// with the fingerprint; ok false when n did not answer within 1 s.
func (n *node) members() (names []string, suspect []string, fp string, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := n.rl.Members(ctx, &sluicev1.MembersRequest{})
	if err != nil {
		return nil, nil, "", false
	}
	for _, m := range resp.GetMembers() {
		names = append(names, m.GetName())
		if m.GetState() != "alive" {
			suspect = append(suspect, m.GetName())
		}
	}
	return names, suspect, resp.GetRingFingerprint(), true
}

func (n *node) ready() bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + n.httpAddr + "/readyz")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// settled says whether every node lists all of them alive, with one ring
// fingerprint, and is ready.
func settled(nodes []*node) bool {
	var fp0 string
	for i, n := range nodes {
		names, suspect, fp, ok := n.members()
		if !ok || len(names) != len(nodes) || len(suspect) > 0 || !n.ready() {
			return false
		}
		if i == 0 {
			fp0 = fp
		} else if fp != fp0 {
			return false
		}
	}
	return true
}

func waitSettled(t *testing.T, nodes []*node, bound time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for !settled(nodes) {
		if time.Since(start) > bound {
			var b strings.Builder
			for _, n := range nodes {
				names, suspect, fp, ok := n.members()
				fmt.Fprintf(&b, "\n%s: members %v suspect %v fp %s answered %v ready %v", n.name, names, suspect, fp, ok, n.ready())
			}
			t.Fatalf("the rings did not settle within %v:%s", bound, b.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

// answer is one check as the test sent it and what came back.
type answer struct {
	phase     string
	entry     string // the node called
	key       string
	sent, got time.Time
	dec       *sluicev1.Decision
	err       error
}

// recorder runs checks and keeps every answer.
type recorder struct {
	rate    int // checks a second of load
	timeout time.Duration
	sem     chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	answers []answer
}

func (r *recorder) check(n *node, phase, key string, hits int64) answer {
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	a := answer{phase: phase, entry: n.name, key: key, sent: time.Now()}
	resp, err := n.rl.Check(ctx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{{
		Name: "pause", Key: key, Hits: proto.Int64(hits), Limit: limit, WindowMs: windowMs,
	}}})
	a.got = time.Now()
	switch {
	case err != nil:
		a.err = err
	case len(resp.GetDecisions()) != 1:
		a.err = fmt.Errorf("%d decisions", len(resp.GetDecisions()))
	default:
		a.dec = resp.GetDecisions()[0]
	}
	if hits > 0 {
		r.mu.Lock()
		r.answers = append(r.answers, a)
		r.mu.Unlock()
	}
	return a
}

// load sends r.rate checks a second, round robin over keys, the i-th to
// the node pick(i/len(keys)) chooses (each key meets every entry), until
// stop is closed, for at most bound and maxChecks checks, with at most
// inflight at once. It returns at once; r.wg covers the checks.
func (r *recorder) load(phase string, keys []string, pick func(i int) *node, stop <-chan struct{}, bound time.Duration) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(r.rate))
		defer tick.Stop()
		end := time.After(bound)
		for i := 0; i < maxChecks; i++ {
			if i > 0 {
				select {
				case <-stop:
					return
				case <-end:
					return
				case <-tick.C:
				}
			}
			r.sem <- struct{}{}
			r.wg.Add(1)
			go func(i int) {
				defer func() { <-r.sem; r.wg.Done() }()
				r.check(pick(i/len(keys)), phase, keys[i%len(keys)], 1)
			}(i)
		}
	}()
}

// keyReport is what one key admitted in a repetition.
type keyReport struct {
	key                string
	admitted, degraded int
	errors             int
	overs, stale       []answer
}

// tally counts every allowed answer of each key (degraded included). An
// allowed answer is stale when its remaining says the decider counted
// fewer hits than the allowed answers the test had received before it
// sent that check: it decided from a window that missed them. overs are
// the allowed answers, in the order they came back, past the limit.
func tally(keys []string, answers []answer) []keyReport {
	var out []keyReport
	for _, k := range keys {
		var mine []answer
		rep := keyReport{key: k}
		for _, a := range answers {
			if a.key != k {
				continue
			}
			if a.err != nil || a.dec.GetError() != "" {
				rep.errors++
			}
			if a.err == nil && a.dec.GetAllowed() {
				mine = append(mine, a)
			}
		}
		slices.SortFunc(mine, func(a, b answer) int { return a.got.Compare(b.got) })
		rep.admitted = len(mine)
		for i, a := range mine {
			if a.dec.GetDegraded() {
				rep.degraded++
			}
			if i >= limit {
				rep.overs = append(rep.overs, a)
			}
			before := 0
			for _, b := range mine {
				if b.got.Before(a.sent) {
					before++
				}
			}
			if a.dec.GetRemaining() > int64(limit-before-1) {
				rep.stale = append(rep.stale, a)
			}
		}
		out = append(out, rep)
	}
	return out
}

// cluster is the three processes.
type cluster struct {
	nodes []*node
	ft    time.Duration // --forward-timeout
	rate  int           // checks a second during the pause and after it
}

func (c *cluster) others(victim *node) []*node {
	var o []*node
	for _, n := range c.nodes {
		if n != victim {
			o = append(o, n)
		}
	}
	return o
}

// ownedKeys finds n fresh keys owned by victim: a peek (0 hits) through
// another node says which node decided it.
func (c *cluster) ownedKeys(t *testing.T, r *recorder, victim *node, prefix string, n int) []string {
	t.Helper()
	via := c.others(victim)[0]
	var keys []string
	for i := 0; len(keys) < n; i++ {
		if i > 200 {
			t.Fatalf("no %d keys owned by %s in 200 tries", n, victim.name)
		}
		k := fmt.Sprintf("%s-%d", prefix, i)
		a := r.check(via, "peek", k, 0)
		if a.err != nil {
			t.Fatalf("peek %s via %s: %v", k, via.name, a.err)
		}
		if a.dec.GetOwner() == victim.name && !a.dec.GetDegraded() {
			keys = append(keys, k)
		}
	}
	return keys
}

// result is one repetition's outcome.
type result struct {
	kind       string
	victim     string
	pause      time.Duration
	detected   time.Duration // SIGSTOP until both others dropped the victim; 0: they did not
	rejoin     time.Duration // SIGCONT until the rings settled again
	took       time.Duration
	keys       []keyReport
	overAdmits int // keys over their limit
}

// verbose (SLUICE_PAUSE_VERBOSE) logs the past-the-limit and stale
// answers of every key, not only of the keys over their limit.
var verbose = os.Getenv("SLUICE_PAUSE_VERBOSE") != ""

// repeat runs one repetition: fresh keys owned by victim, spent, idle,
// victim stopped (long: until both others dropped it from their rings,
// then hold more; short: for short), checks through the others
// meanwhile; then resumed while checks go to it straight and through the
// others.
func (c *cluster) repeat(t *testing.T, rep int, kind string, victim *node, short, hold time.Duration) result {
	t.Helper()
	begin := time.Now()
	res := result{kind: kind, victim: victim.name}
	r := &recorder{rate: c.rate, timeout: 3*c.ft + time.Second, sem: make(chan struct{}, inflight)}
	keys := c.ownedKeys(t, r, victim, fmt.Sprintf("r%d-%s-%s", rep, kind, victim.name), keysPerRep)
	// Spend part of the limit through every node.
	for _, k := range keys {
		for i := range spent {
			a := r.check(c.nodes[i%len(c.nodes)], "spend", k, 1)
			if a.err != nil || !a.dec.GetAllowed() {
				t.Fatalf("spend %s: %s", k, rel(a, begin))
			}
		}
	}
	time.Sleep(idle) // > the replication interval: the copies are current
	others := c.others(victim)
	stopLoad := make(chan struct{})
	victim.signal(t, syscall.SIGSTOP)
	stoppedAt := time.Now()
	// The i-th check goes to key i%len(keys) through the node pick(i/len(keys))
	// chooses: every key through every entry.
	r.load("paused", keys, func(round int) *node { return others[round%len(others)] }, stopLoad, 60*time.Second)
	switch kind {
	case "long":
		for {
			gone := 0
			for _, o := range others {
				if names, _, _, ok := o.members(); ok && !slices.Contains(names, victim.name) {
					gone++
				}
			}
			if gone == len(others) {
				res.detected = time.Since(stoppedAt)
				break
			}
			if time.Since(stoppedAt) > 60*time.Second {
				victim.signal(t, syscall.SIGCONT)
				t.Fatalf("%s stopped 60 s and still in the others' rings", victim.name)
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(hold)
	case "short":
		deadline := stoppedAt.Add(short)
		for time.Now().Before(deadline) {
			for _, o := range others {
				names, _, _, ok := o.members()
				if ok && res.detected == 0 && !slices.Contains(names, victim.name) {
					res.detected = time.Since(stoppedAt) // the pause was not short after all
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	close(stopLoad)
	victim.signal(t, syscall.SIGCONT)
	resumedAt := time.Now()
	res.pause = resumedAt.Sub(stoppedAt)
	// At once one check of every key through every node (clients that
	// were waiting), then a third of the checks straight to the resumed
	// node and the rest through the others.
	entries := []*node{victim, others[0], others[1]}
	for _, k := range keys {
		for _, n := range entries {
			r.sem <- struct{}{}
			r.wg.Add(1)
			go func() {
				defer func() { <-r.sem; r.wg.Done() }()
				r.check(n, "resumed", k, 1)
			}()
		}
	}
	r.load("resumed", keys, func(round int) *node { return entries[round%len(entries)] }, make(chan struct{}), resumeFor)
	res.rejoin = waitSettled(t, c.nodes, 60*time.Second)
	r.wg.Wait()
	res.took = time.Since(begin)
	res.keys = tally(keys, r.answers)

	dropped := "never"
	if res.detected > 0 {
		dropped = "after " + res.detected.Round(time.Millisecond).String()
	}
	t.Logf("rep %d %s: paused %s for %v (dropped from both others' rings %s), rings settled %v after SIGCONT, %d checks, took %v",
		rep, kind, victim.name, res.pause.Round(time.Millisecond), dropped,
		res.rejoin.Round(time.Millisecond), len(r.answers), res.took.Round(time.Millisecond))
	for _, k := range res.keys {
		mark := ""
		if k.admitted > limit {
			res.overAdmits++
			mark = "  OVER"
		}
		t.Logf("  key %s admitted %d of %d, %d degraded, %d errors, %d stale%s", k.key, k.admitted, limit, k.degraded, k.errors, len(k.stale), mark)
		if k.admitted <= limit && !verbose {
			continue
		}
		for _, a := range k.overs {
			tag := ""
			if slices.ContainsFunc(k.stale, func(b answer) bool { return b.sent == a.sent && b.entry == a.entry }) {
				tag = ", stale"
			}
			t.Logf("    past the limit (answer order%s): %s", tag, rel(a, stoppedAt))
		}
		for _, a := range k.stale {
			if !slices.ContainsFunc(k.overs, func(b answer) bool { return b.sent == a.sent && b.entry == a.entry }) {
				t.Logf("    stale, within the limit: %s", rel(a, stoppedAt))
			}
		}
		// Who decided this key's allowed answers, by phase.
		groups := map[string]int{}
		for _, a := range r.answers {
			if a.key == k.key && a.err == nil && a.dec.GetAllowed() {
				groups[fmt.Sprintf("%s via %s decided by %s degraded=%v", a.phase, a.entry, a.dec.GetOwner(), a.dec.GetDegraded())]++
			}
		}
		for _, g := range slices.Sorted(maps.Keys(groups)) {
			t.Logf("      allowed %2d: %s", groups[g], g)
		}
	}
	return res
}

// rel prints a with times relative to the SIGSTOP.
func rel(a answer, stop time.Time) string {
	s := fmt.Sprintf("%s sent %+.3fs answered %+.3fs via %s", a.phase, a.sent.Sub(stop).Seconds(), a.got.Sub(stop).Seconds(), a.entry)
	if a.err != nil {
		return s + " err: " + a.err.Error()
	}
	return s + " {" + strings.TrimSpace(prototext.MarshalOptions{}.Format(a.dec)) + "}"
}

// TestPausedOwner is issue 36: an owner frozen with SIGSTOP, for longer
// than failure detection and for shorter, then resumed; no key may admit
// beyond its limit.
func TestPausedOwner(t *testing.T) {
	if os.Getenv(enableEnv) == "" {
		t.Skipf("set %s=1 to run (it takes minutes)", enableEnv)
	}
	reps := 10
	if v := os.Getenv("SLUICE_PAUSE_REPS"); v != "" {
		var err error
		if reps, err = strconv.Atoi(v); err != nil || reps < 1 {
			t.Fatalf("SLUICE_PAUSE_REPS: %q", v)
		}
	}
	profile := envString("SLUICE_PAUSE_PROFILE", "lan")
	ft := envDuration(t, "SLUICE_PAUSE_FORWARD_TIMEOUT", 2*time.Second) // serve's default
	short := envDuration(t, "SLUICE_PAUSE_SHORT", 3*ft/2)
	hold := envDuration(t, "SLUICE_PAUSE_HOLD", 2*time.Second)
	// 48 checks a second (12 per key): the issue ran 24, at which a
	// stand-in holder spends about half of what is left in a short pause,
	// too little for the resumed owner's stale decisions to pass the limit.
	rate := 48
	if v := os.Getenv("SLUICE_PAUSE_RATE"); v != "" {
		var err error
		if rate, err = strconv.Atoi(v); err != nil || rate < 1 || rate > 1000 {
			t.Fatalf("SLUICE_PAUSE_RATE: %q", v)
		}
	}
	kinds := strings.Split(envString("SLUICE_PAUSE_KINDS", "long,short"), ",")
	for _, k := range kinds {
		if k != "long" && k != "short" {
			t.Fatalf("SLUICE_PAUSE_KINDS: %q is neither long nor short", k)
		}
	}
	logDir := os.Getenv("SLUICE_PAUSE_LOGDIR")
	if logDir == "" {
		logDir = t.TempDir()
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--profile", profile, "--forward-timeout", ft.String()}
	t.Logf("binary %s, flags %v, short pause %v, long pause: until dropped + %v, %d checks/s, logs in %s", bin, flags, short, hold, rate, logDir)

	c := &cluster{ft: ft, rate: rate}
	n1 := startNode(t, logDir, "n1", "", flags)
	c.nodes = []*node{n1,
		startNode(t, logDir, "n2", n1.gossipAddr, flags),
		startNode(t, logDir, "n3", n1.gossipAddr, flags)}
	t.Logf("cluster settled in %v", waitSettled(t, c.nodes, 60*time.Second).Round(time.Millisecond))

	type sum struct {
		reps, over, keysOver int
		detect, took         []time.Duration
	}
	sums := map[string]*sum{}
	for rep := range reps {
		for _, kind := range kinds {
			victim := c.nodes[(rep+2)%len(c.nodes)] // n3 first
			res := c.repeat(t, rep, kind, victim, short, hold)
			s := sums[kind]
			if s == nil {
				s = &sum{}
				sums[kind] = s
			}
			s.reps++
			if res.overAdmits > 0 {
				s.over++
				s.keysOver += res.overAdmits
			}
			if res.detected > 0 {
				s.detect = append(s.detect, res.detected)
			}
			s.took = append(s.took, res.took)
			waitSettled(t, c.nodes, 60*time.Second)
		}
	}
	for _, kind := range kinds {
		s := sums[kind]
		slices.Sort(s.detect)
		slices.Sort(s.took)
		t.Logf("SUMMARY %s: %d of %d repetitions over-admitted (%d keys); victim dropped from the rings after %v; a repetition took %v",
			kind, s.over, s.reps, s.keysOver, spread(s.detect), spread(s.took))
		if s.over > 0 {
			t.Errorf("%s pause: %d of %d repetitions admitted beyond the limit", kind, s.over, s.reps)
		}
	}
}

// spread is min/median/max of sorted ds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "never"
	}
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }
	return fmt.Sprintf("min %v median %v max %v", r(ds[0]), r(ds[len(ds)/2]), r(ds[len(ds)-1]))
}
