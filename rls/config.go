package rls

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Limits of what a sluice check accepts (see rpc/wire.go); longer check
// names and keys are replaced by a hash.
const (
	maxNameBytes = 256
	maxKeyBytes  = 512
	// maxWindow is the longest window sluice accepts: 366 days.
	maxWindow = 366 * 24 * time.Hour
)

// Unit is the unit of a rule's window, as on the wire of RLS v3
// (SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR).
type Unit = rlsv3.RateLimitResponse_RateLimit_Unit

// unitDurations maps each unit to its length. As in envoyproxy/ratelimit,
// a month is 30 days and a year 365 days; windows are aligned to the Unix
// epoch (a week starts on a Thursday, 00:00 UTC).
var unitDurations = map[Unit]time.Duration{
	rlsv3.RateLimitResponse_RateLimit_SECOND: time.Second,
	rlsv3.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	rlsv3.RateLimitResponse_RateLimit_HOUR:   time.Hour,
	rlsv3.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_MONTH:  30 * 24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_YEAR:   365 * 24 * time.Hour,
}

// Rule is one rate_limit block of a rule file: RequestsPerUnit requests
// per Window. A Rule is immutable once loaded and safe to share.
type Rule struct {
	// Domain is the domain of the file the rule is in.
	Domain string
	// FullKey names the rule as envoyproxy/ratelimit does in its stats:
	// the domain and the path of descriptors, e.g.
	// "messaging.message_type_marketing.to_number".
	FullKey string
	// Name is the rule's optional name (rate_limit.name), which other
	// rules' Replaces refer to.
	Name string
	// Replaces lists the names of the rules this rule replaces: when a
	// request matches both, only this one is applied.
	Replaces []string
	// RequestsPerUnit is the number of hits allowed per Window; 0 refuses
	// every request.
	RequestsPerUnit uint32
	// Unit is the unit of the window; UNKNOWN for an unlimited rule.
	Unit Unit
	// UnitMultiplier is the number of units in the window, >= 1 (default 1).
	UnitMultiplier uint32
	// Window is Unit x UnitMultiplier, at most 366 days; 0 when unlimited.
	Window time.Duration
	// Unlimited rules are never counted: every request is OK.
	Unlimited bool
	// ShadowMode rules are counted as usual, but their answer is always OK.
	ShadowMode bool
	// QuotaMode rules (the descriptor's quota_mode) are quota descriptors:
	// one over its limit is answered OVER_LIMIT in its status, but refuses
	// the request only when all the request's quota descriptors are over
	// (as envoyproxy/ratelimit).
	QuotaMode bool
	// Metadata is the descriptor's metadata (the rule file's metadata
	// key), returned in the response's dynamic_metadata when the request
	// passes this rule and dynamic metadata is on ([Options]); nil when
	// the file gives none.
	Metadata *structpb.Struct
	// DetailedMetric and ValueToMetric are the descriptor's settings of
	// the same names. They are kept for the config dump only: sluice's
	// statistics have one series per rule, never one per value.
	DetailedMetric, ValueToMetric bool
	// File is the rule file the rule is in.
	File string
	// Line is the 1-based line of the rule's descriptor in File.
	Line int

	checkName string // the sluice check name
}

// ConfigError is a bad rule file (or path given to [Load]).
type ConfigError struct {
	// File is the rule file (or the path) at fault.
	File string
	// Line and Column locate the fault, 1-based; 0 when unknown.
	Line, Column int
	// Field names the setting, e.g. "descriptors[0].rate_limit.unit";
	// empty for a YAML syntax or type error, which Msg describes.
	Field string
	// Msg says what is wrong.
	Msg string
}

// Error returns "file:line:column: field: message".
func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Config is a set of loaded rule files: for each domain, a tree of
// descriptors. A Config is immutable once loaded and safe for concurrent
// use. The zero value has no domains: every request is OK.
type Config struct {
	domains map[string]*node
	files   []string
	rules   []*Rule // every rule, in load order
	// onOwner is each domain's on_owner_unavailable (absent: unspecified).
	onOwner map[string]sluicev1.OwnerUnavailablePolicy
	// scope is each domain's scope (absent: unspecified).
	scope map[string]sluicev1.Scope
}

// Scope returns the scope the checks of domain are sent with (the
// domain's scope, a sluice extension of the rule format: global, regional
// or exact, see docs/regions.md). SCOPE_UNSPECIFIED (global with
// several regions) when the file does not say, and for an unknown domain.
func (c *Config) Scope(domain string) sluicev1.Scope {
	if c == nil {
		return sluicev1.Scope_SCOPE_UNSPECIFIED
	}
	return c.scope[domain]
}

// OnOwnerUnavailable returns the policy the checks of domain are sent
// with: what a node answers for a descriptor whose key's owner it cannot
// reach (the domain's on_owner_unavailable, a sluice extension of the
// rule format). OWNER_UNAVAILABLE_UNSPECIFIED (the node's default, local)
// when the file does not say, and for an unknown domain.
func (c *Config) OnOwnerUnavailable(domain string) sluicev1.OwnerUnavailablePolicy {
	if c == nil {
		return sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED
	}
	return c.onOwner[domain]
}

// Domains returns the configured domains, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	ds := make([]string, 0, len(c.domains))
	for d := range c.domains {
		ds = append(ds, d)
	}
	sort.Strings(ds)
	return ds
}

// Files returns the rule files the Config was loaded from, in load order.
func (c *Config) Files() []string {
	if c == nil {
		return nil
	}
	return append([]string(nil), c.files...)
}

// node is one descriptor of the tree (or a domain's root).
type node struct {
	key, value     string
	wildcard       bool // value holds a '*'
	shareThreshold bool
	rule           *Rule
	file           string
	line           int
	id             string // this descriptor's part of the check name

	exact map[pair]*node // key and literal value
	wild  []*node        // key and wildcard value, in file order
	byKey map[string]*node
}

type pair struct{ key, value string }

func (n *node) hasChildren() bool { return len(n.exact)+len(n.wild)+len(n.byKey) > 0 }

// The YAML shapes, as envoyproxy/ratelimit reads them. Unknown keys are
// refused, as there.
type yamlRoot struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
	// OnOwnerUnavailable is sluice's own: local, allow or deny.
	OnOwnerUnavailable *string `yaml:"on_owner_unavailable"`
	// Scope is sluice's own: global, regional or exact.
	Scope *string `yaml:"scope"`
}

// scopes are the values of scope.
var scopes = map[string]sluicev1.Scope{
	"global":   sluicev1.Scope_SCOPE_GLOBAL,
	"regional": sluicev1.Scope_SCOPE_REGIONAL,
	"exact":    sluicev1.Scope_SCOPE_EXACT,
}

// ownerPolicies are the values of on_owner_unavailable.
var ownerPolicies = map[string]sluicev1.OwnerUnavailablePolicy{
	"local": sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_LOCAL,
	"allow": sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_ALLOW,
	"deny":  sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY,
}

type yamlDescriptor struct {
	Key         string           `yaml:"key"`
	Value       string           `yaml:"value"`
	RateLimit   *yamlRateLimit   `yaml:"rate_limit"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
	ShadowMode  yamlBool         `yaml:"shadow_mode"`
	QuotaMode   yamlBool         `yaml:"quota_mode"`
	// Metrics-only settings of envoyproxy/ratelimit: kept for the dump;
	// sluice's statistics have one series per rule.
	DetailedMetric yamlBool       `yaml:"detailed_metric"`
	ValueToMetric  yamlBool       `yaml:"value_to_metric"`
	Metadata       map[string]any `yaml:"metadata"`
	ShareThreshold yamlBool       `yaml:"share_threshold"`
}

type yamlRateLimit struct {
	RequestsPerUnit uint32         `yaml:"requests_per_unit"`
	Unit            string         `yaml:"unit"`
	UnitMultiplier  *uint32        `yaml:"unit_multiplier"`
	Unlimited       yamlBool       `yaml:"unlimited"`
	Name            string         `yaml:"name"`
	Replaces        []yamlReplaces `yaml:"replaces"`
}

// yamlBool is a boolean as YAML 1.1 writes it, as envoyproxy/ratelimit's
// loader (yaml.v2) reads it: true/false, yes/no, y/n, on/off, in lower,
// title or upper case.
type yamlBool bool

var yamlBools = map[string]bool{
	"true": true, "yes": true, "y": true, "on": true,
	"false": false, "no": false, "n": false, "off": false,
}

// UnmarshalYAML implements yaml.NodeUnmarshaler.
func (b *yamlBool) UnmarshalYAML(node ast.Node) error {
	tok := node.GetToken()
	if tok == nil {
		return errors.New("want true or false")
	}
	s := tok.Value
	if v, ok := yamlBools[strings.ToLower(s)]; ok && (s == strings.ToLower(s) || s == strings.ToUpper(s) || s == strings.ToUpper(s[:1])+s[1:]) {
		*b = yamlBool(v)
		return nil
	}
	pe := &posError{msg: fmt.Sprintf("want true or false, got %q", s)}
	if tok.Position != nil {
		pe.line, pe.column = tok.Position.Line, tok.Position.Column
	}
	return pe
}

// posError is an error of a YAML value at a known line and column.
type posError struct {
	line, column int
	msg          string
}

func (e *posError) Error() string { return e.msg }

type yamlReplaces struct {
	Name string `yaml:"name"`
}

// LoadOptions are the settings of loading rule files. The zero value
// loads as envoyproxy/ratelimit does by default.
type LoadOptions struct {
	// MergeDomains lets several files hold the same domain: their
	// descriptors are merged into one tree (envoyproxy/ratelimit's
	// MERGE_DOMAIN_CONFIG). A descriptor that two files both give is
	// still an error, and so are two different on_owner_unavailable or
	// scope values of one domain. Off: a domain in a second file is an
	// error.
	MergeDomains bool
}

// Load reads the rule files at path as [LoadOptions.Load] does with the
// zero LoadOptions.
func Load(path string) (*Config, error) { return LoadOptions{}.Load(path) }

// Load reads the rule files at path: one file, or every *.yaml and *.yml
// file directly in a directory (sorted by name; names starting with "."
// are skipped, so a Kubernetes ConfigMap volume works). A directory with
// no rule file at all, in it or below it, loads as a Config with no
// domains (every request OK), as in envoyproxy/ratelimit, so that rules
// can be added while a node runs. Each file holds one domain; a domain
// may not appear twice unless o.MergeDomains. Any error is a
// *ConfigError naming the file and, where it has one, the line; nothing
// is loaded then.
//
// A load must not switch every limit off unnoticed, so two more cases are
// errors naming the files (see [EmptyError]): rules that yield no rule
// (no rate_limit anywhere) while rule files exist at or below path (the
// files of a subdirectory are not read), and a directory that holds a
// config/ directory of rule files, envoyproxy/ratelimit's layout: the
// peer reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml, so sluice
// is given that config/ directory itself.
func (o LoadOptions) Load(path string) (*Config, error) {
	cfg, err := o.load(path)
	if err != nil {
		return nil, err
	}
	if err := checkNotEmpty(path, cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// load is Load without the checks of an empty load.
func (o LoadOptions) load(path string) (*Config, error) {
	if path == "" {
		return nil, &ConfigError{File: "--rls-config", Msg: "empty path"}
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, &ConfigError{File: path, Msg: errMsg(err)}
	}
	files := []string{path}
	if st.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, &ConfigError{File: path, Msg: errMsg(err)}
		}
		files = files[:0]
		for _, e := range entries {
			name := e.Name()
			if !IsRuleFile(name) {
				continue
			}
			full := filepath.Join(path, name)
			if fi, err := os.Stat(full); err != nil || fi.IsDir() { // follows symlinks
				continue
			}
			files = append(files, full)
		}
	}
	b := newBuilder(o)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, &ConfigError{File: f, Msg: errMsg(err)}
		}
		if err := b.add(f, data); err != nil {
			return nil, err
		}
	}
	return b.cfg, nil
}

// IsRuleFile reports whether a directory entry called name is read as a
// rule file: it ends in .yaml or .yml and does not start with ".".
func IsRuleFile(name string) bool {
	return !strings.HasPrefix(name, ".") && (strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml"))
}

// errMsg strips the path from a *fs.PathError, which ConfigError names.
func errMsg(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}

// Parse loads rule files given as (name, contents) pairs as
// [LoadOptions.Parse] does with the zero LoadOptions.
func Parse(files ...File) (*Config, error) { return LoadOptions{}.Parse(files...) }

// Parse loads rule files given as (name, contents) pairs, in order, as
// [LoadOptions.Load] does; name is used in errors only.
func (o LoadOptions) Parse(files ...File) (*Config, error) {
	b := newBuilder(o)
	for _, f := range files {
		if err := b.add(f.Name, f.Data); err != nil {
			return nil, err
		}
	}
	return b.cfg, nil
}

// File is one rule file's name and YAML contents, for [Parse].
type File struct {
	Name string
	Data []byte
}

type builder struct {
	opts        LoadOptions
	cfg         *Config
	domainFiles map[string]string
	setIn       map[string]string // domain + "\x00" + key -> the file that set a domain-level key
}

func newBuilder(o LoadOptions) *builder {
	return &builder{opts: o, cfg: &Config{domains: map[string]*node{}, onOwner: map[string]sluicev1.OwnerUnavailablePolicy{}, scope: map[string]sluicev1.Scope{}}, domainFiles: map[string]string{}, setIn: map[string]string{}}
}

// add parses one file into b.cfg.
func (b *builder) add(file string, data []byte) (err error) {
	defer func() {
		// A bad file is an error, never a crash, whatever the YAML library
		// does with it.
		if p := recover(); p != nil {
			err = &ConfigError{File: file, Msg: fmt.Sprintf("cannot parse the YAML: %v", p)}
		}
	}()
	if len(data) > maxRuleFileBytes {
		return &ConfigError{File: file, Msg: fmt.Sprintf("%d bytes: a rule file holds at most %d", len(data), maxRuleFileBytes)}
	}
	if line := tooDeep(data, maxFlowDepth); line > 0 {
		// The YAML parser's time grows faster than the nesting: refused
		// before it runs.
		return &ConfigError{File: file, Line: line, Msg: fmt.Sprintf("brackets nested deeper than %d levels", maxFlowDepth)}
	}
	if f, err := parser.ParseBytes(data, 0); err == nil && len(f.Docs) > 1 {
		ce := &ConfigError{File: file, Msg: "a second YAML document (---): one file holds one domain"}
		if b := f.Docs[1].Body; b != nil && b.GetToken() != nil && b.GetToken().Position != nil {
			ce.Line = b.GetToken().Position.Line
		}
		return ce
	}
	var root yamlRoot
	if err := yaml.UnmarshalWithOptions(data, &root, yaml.DisallowUnknownField()); err != nil {
		ce := &ConfigError{File: file, Msg: err.Error()}
		var ye yaml.Error
		var pe *posError
		if errors.As(err, &pe) {
			ce.Line, ce.Column, ce.Msg = pe.line, pe.column, pe.msg
		} else if errors.As(err, &ye) {
			ce.Msg = ye.GetMessage()
			if tok := ye.GetToken(); tok != nil && tok.Position != nil {
				ce.Line, ce.Column = tok.Position.Line, tok.Position.Column
			}
		}
		return ce
	}
	l := &fileLoader{file: file, data: data}
	if root.Domain == "" {
		return l.errorf(nil, "domain", "required (a config file cannot have an empty domain)")
	}
	prev, merging := b.domainFiles[root.Domain]
	if merging && !b.opts.MergeDomains {
		return l.errorf(ypath{"domain"}, "domain", "duplicate domain %q (also in %s; set --rls-merge-domain-config to merge a domain's files)", root.Domain, prev)
	}
	var policy sluicev1.OwnerUnavailablePolicy
	if v := root.OnOwnerUnavailable; v != nil {
		var ok bool
		if policy, ok = ownerPolicies[*v]; !ok {
			return l.errorf(ypath{"on_owner_unavailable"}, "on_owner_unavailable", "want local, allow or deny, got %q", *v)
		}
		if was, set := b.cfg.onOwner[root.Domain]; merging && set && was != policy {
			return l.errorf(ypath{"on_owner_unavailable"}, "on_owner_unavailable", "%q differs from the value of domain %q in %s", *v, root.Domain, b.setIn[root.Domain+"\x00on_owner_unavailable"])
		}
	}
	var scope sluicev1.Scope
	if v := root.Scope; v != nil {
		var ok bool
		if scope, ok = scopes[*v]; !ok {
			return l.errorf(ypath{"scope"}, "scope", "want global, regional or exact, got %q", *v)
		}
		if was, set := b.cfg.scope[root.Domain]; merging && set && was != scope {
			return l.errorf(ypath{"scope"}, "scope", "%q differs from the value of domain %q in %s", *v, root.Domain, b.setIn[root.Domain+"\x00scope"])
		}
	}
	dom := b.cfg.domains[root.Domain]
	if dom == nil {
		dom = &node{id: "rls " + strconv.Quote(root.Domain)}
	}
	// A merge loads into the domain's tree in place: on an error the
	// whole load fails, so no half-merged tree is ever served.
	if err := l.loadLevel(dom, root.Domain, root.Domain, ypath{"descriptors"}, "descriptors", root.Descriptors); err != nil {
		return err
	}
	b.cfg.rules = append(b.cfg.rules, l.rules...)
	if !merging {
		b.domainFiles[root.Domain] = file
	}
	b.cfg.domains[root.Domain] = dom
	if _, set := b.cfg.onOwner[root.Domain]; !set && policy != sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED {
		b.cfg.onOwner[root.Domain] = policy
		b.setIn[root.Domain+"\x00on_owner_unavailable"] = file
	}
	if _, set := b.cfg.scope[root.Domain]; !set && scope != sluicev1.Scope_SCOPE_UNSPECIFIED {
		b.cfg.scope[root.Domain] = scope
		b.setIn[root.Domain+"\x00scope"] = file
	}
	b.cfg.files = append(b.cfg.files, file)
	return nil
}

// fileLoader turns one file's descriptors into nodes, locating errors.
type fileLoader struct {
	file  string
	data  []byte
	ast   *ast.File // parsed on the first lookup of a line
	rules []*Rule   // the file's rules, in file order
}

// ypath is a YAML path from the document root: strings are mapping keys,
// ints sequence indexes.
type ypath []any

// with returns p extended by segs, sharing nothing with p.
func (p ypath) with(segs ...any) ypath {
	return append(append(ypath(nil), p...), segs...)
}

func (p ypath) build() *yaml.Path {
	b := (&yaml.PathBuilder{}).Root()
	for _, s := range p {
		switch s := s.(type) {
		case string:
			b = b.Child(s)
		case int:
			b = b.Index(uint(s))
		}
	}
	return b.Build()
}

// line returns the line and column of the YAML node at path p, or 0, 0.
func (l *fileLoader) line(p ypath) (int, int) {
	if p == nil {
		return 0, 0
	}
	if l.ast == nil {
		f, err := parser.ParseBytes(l.data, 0)
		if err != nil {
			return 0, 0
		}
		l.ast = f
	}
	n, err := p.build().FilterFile(l.ast)
	if err != nil || n == nil || n.GetToken() == nil || n.GetToken().Position == nil {
		return 0, 0
	}
	pos := n.GetToken().Position
	return pos.Line, pos.Column
}

// errorf returns a ConfigError for field at the node at path p (nil: no
// line).
func (l *fileLoader) errorf(p ypath, field, format string, args ...any) error {
	ce := &ConfigError{File: l.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	ce.Line, ce.Column = l.line(p)
	return ce
}

// loadLevel loads descs as the children of parent. fullKey is the
// parent's envoyproxy/ratelimit stats key; p and field locate descs.
func (l *fileLoader) loadLevel(parent *node, domain, fullKey string, p ypath, field string, descs []yamlDescriptor) error {
	for i, d := range descs {
		dp := p.with(i)
		df := fmt.Sprintf("%s[%d]", field, i)
		line, _ := l.line(dp)
		if d.Key == "" {
			return l.errorf(dp, df+".key", "required (a descriptor has an empty key)")
		}
		n := &node{key: d.Key, value: d.Value, wildcard: strings.Contains(d.Value, "*"),
			shareThreshold: bool(d.ShareThreshold), file: l.file, line: line}
		finalKey := d.Key
		n.id = parent.id + " " + strconv.Quote(d.Key)
		if d.Value != "" {
			finalKey += "_" + d.Value
			n.id += "=" + strconv.Quote(d.Value)
		}
		if n.shareThreshold && !n.wildcard {
			return l.errorf(dp.with("share_threshold"), df+".share_threshold",
				"only allowed with a wildcard value (one holding '*'), got value %q", d.Value)
		}
		var dup *node
		switch {
		case d.Value == "":
			dup = parent.byKey[d.Key]
		case n.wildcard:
			for _, w := range parent.wild {
				if w.key == d.Key && w.value == d.Value {
					dup = w
				}
			}
		default:
			dup = parent.exact[pair{d.Key, d.Value}]
		}
		if dup != nil {
			where := fmt.Sprintf("line %d", dup.line)
			if dup.file != l.file {
				where = fmt.Sprintf("%s:%d", dup.file, dup.line)
			}
			return l.errorf(dp, df, "duplicate descriptor composite key '%s.%s' (first at %s)", fullKey, finalKey, where)
		}
		// Metadata is checked wherever it is, as the peer does, though
		// only a rule's is ever returned.
		md, err := metadataStruct(d.Metadata)
		if err != nil {
			return l.errorf(dp.with("metadata"), df+".metadata", "%v", err)
		}
		if d.RateLimit != nil {
			r, err := l.loadRule(d.RateLimit, dp.with("rate_limit"), df+".rate_limit")
			if err != nil {
				return err
			}
			r.Domain, r.FullKey, r.ShadowMode, r.File, r.Line = domain, fullKey+"."+finalKey, bool(d.ShadowMode), l.file, line
			r.QuotaMode, r.DetailedMetric, r.ValueToMetric = bool(d.QuotaMode), bool(d.DetailedMetric), bool(d.ValueToMetric)
			r.Metadata = md
			l.rules = append(l.rules, r)
			r.checkName = n.id
			if len(r.checkName) > maxNameBytes {
				sum := sha256.Sum256([]byte(n.id))
				r.checkName = "rls#" + hex.EncodeToString(sum[:])
			}
			n.rule = r
		}
		if err := l.loadLevel(n, domain, fullKey+"."+finalKey, dp.with("descriptors"), df+".descriptors", d.Descriptors); err != nil {
			return err
		}
		switch {
		case d.Value == "":
			if parent.byKey == nil {
				parent.byKey = map[string]*node{}
			}
			parent.byKey[d.Key] = n
		case n.wildcard:
			parent.wild = append(parent.wild, n)
		default:
			if parent.exact == nil {
				parent.exact = map[pair]*node{}
			}
			parent.exact[pair{d.Key, d.Value}] = n
		}
	}
	return nil
}

// Bounds of a rule file, checked before it is parsed.
const (
	maxRuleFileBytes = 4 << 20 // 4 MiB
	maxFlowDepth     = 256     // [ and { within one another
)

// tooDeep returns the 1-based line where data's flow brackets ([ and {,
// outside quotes and comments) first nest deeper than limit, or 0.
func tooDeep(data []byte, limit int) int {
	depth, line := 0, 1
	var quote byte // ' or " while in a quoted scalar
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case c == '\n':
			line++
		case quote == '"' && c == '\\':
			i++ // an escaped character
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#' && (i == 0 || data[i-1] == ' ' || data[i-1] == '\t' || data[i-1] == '\n'):
			for i+1 < len(data) && data[i+1] != '\n' {
				i++
			}
		case c == '[' || c == '{':
			if depth++; depth > limit {
				return line
			}
		case c == ']' || c == '}':
			depth = max(depth-1, 0)
		}
	}
	return 0
}

// Bounds of a descriptor's metadata: YAML aliases make a small file hold
// a large tree (each alias a copy once made an Envoy Struct), which must
// not exhaust a node's memory on a load or a reload.
const (
	maxMetadataValues = 10000 // values (scalars, lists and maps), aliases expanded
	maxMetadataDepth  = 32    // maps and lists within one another
)

// metadataStruct returns m as the protobuf Struct Envoy gets, nil for
// none, or an error saying why it cannot be one: more than
// maxMetadataValues values or maxMetadataDepth levels, a NaN or infinite
// number (which JSON cannot carry), or a value of another type (e.g. a
// timestamp).
func metadataStruct(m map[string]any) (*structpb.Struct, error) {
	if len(m) == 0 {
		return nil, nil
	}
	n := 0
	var walk func(v any, depth int) error
	walk = func(v any, depth int) error {
		if n++; n > maxMetadataValues {
			return fmt.Errorf("more than %d values (aliases counted as copies)", maxMetadataValues)
		}
		if depth > maxMetadataDepth {
			return fmt.Errorf("nested deeper than %d levels", maxMetadataDepth)
		}
		switch v := v.(type) {
		case map[string]any:
			for _, e := range v {
				if err := walk(e, depth+1); err != nil {
					return err
				}
			}
		case []any:
			for _, e := range v {
				if err := walk(e, depth+1); err != nil {
					return err
				}
			}
		case float64:
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Errorf("%v is not a number JSON can carry", v)
			}
		case float32:
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("%v is not a number JSON can carry", v)
			}
		}
		return nil
	}
	if err := walk(m, 0); err != nil {
		return nil, err
	}
	md, err := structpb.NewStruct(m)
	if err != nil {
		return nil, fmt.Errorf("cannot be returned as Envoy metadata: %v", err)
	}
	return md, nil
}

// loadRule checks one rate_limit block as envoyproxy/ratelimit does.
func (l *fileLoader) loadRule(y *yamlRateLimit, p ypath, field string) (*Rule, error) {
	r := &Rule{Name: y.Name, RequestsPerUnit: y.RequestsPerUnit, Unlimited: bool(y.Unlimited), UnitMultiplier: 1}
	unit, known := rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(y.Unit)]
	valid := known && unit != int32(rlsv3.RateLimitResponse_RateLimit_UNKNOWN)
	switch {
	case bool(y.Unlimited) && valid:
		return nil, l.errorf(p.with("unit"), field+".unit", "should not specify a rate limit unit when unlimited")
	case !bool(y.Unlimited) && !valid:
		return nil, l.errorf(p.with("unit"), field+".unit",
			"invalid rate limit unit %q (want second, minute, hour, day, week, month or year)", y.Unit)
	}
	if y.UnitMultiplier != nil {
		if *y.UnitMultiplier == 0 {
			return nil, l.errorf(p.with("unit_multiplier"), field+".unit_multiplier", "must be >= 1, got 0")
		}
		r.UnitMultiplier = *y.UnitMultiplier
	}
	if !r.Unlimited {
		r.Unit = Unit(unit)
		u := unitDurations[r.Unit]
		if time.Duration(r.UnitMultiplier) > maxWindow/u {
			return nil, l.errorf(p.with("unit_multiplier"), field+".unit_multiplier",
				"the window (%d x %s) is longer than sluice's longest, 366 days", r.UnitMultiplier, strings.ToLower(y.Unit))
		}
		r.Window = u * time.Duration(r.UnitMultiplier)
	}
	for i, rep := range y.Replaces {
		rp := p.with("replaces", i)
		rf := fmt.Sprintf("%s.replaces[%d].name", field, i)
		if rep.Name == "" {
			return nil, l.errorf(rp, rf, "should not be empty")
		}
		if rep.Name == y.Name {
			return nil, l.errorf(rp, rf, "should not be the rule's own name %q", y.Name)
		}
		r.Replaces = append(r.Replaces, rep.Name)
	}
	return r, nil
}

// Rules returns every loaded rule, in load order (file by file, each in
// file order).
func (c *Config) Rules() []*Rule {
	if c == nil {
		return nil
	}
	return append([]*Rule(nil), c.rules...)
}

// Dump returns the loaded rules as envoyproxy/ratelimit's /rlconfig
// writes them, one line a rule, sorted by full key:
//
//	rl.foo_bar: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false
//
// followed, where they apply, by sluice's additions to the line:
// unit_multiplier=N (N > 1), unlimited, name=NAME, and the file and line
// the rule is at ("@ rules/rl.yaml:12").
func (c *Config) Dump() string {
	rules := c.Rules()
	sort.SliceStable(rules, func(i, j int) bool { return rules[i].FullKey < rules[j].FullKey })
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t",
			r.FullKey, r.Unit, r.RequestsPerUnit, r.ShadowMode, r.QuotaMode)
		if r.UnitMultiplier > 1 {
			fmt.Fprintf(&b, ", unit_multiplier=%d", r.UnitMultiplier)
		}
		if r.Unlimited {
			b.WriteString(", unlimited")
		}
		if r.Name != "" {
			fmt.Fprintf(&b, ", name=%s", r.Name)
		}
		fmt.Fprintf(&b, " @ %s:%d\n", r.File, r.Line)
	}
	return b.String()
}
