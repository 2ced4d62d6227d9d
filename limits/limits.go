// Package limits reads sluice's named limits: a YAML file that gives limits
// by name (e.g. "api": 30 hits per minute, token bucket, burst 60), with
// optional overrides by key prefix (e.g. keys starting "tier:pro:" get 300)
// and a shadow mode (counted and reported, always allowed). A check that
// names a configured limit and carries no numbers of its own gets the
// file's numbers.
//
// The file looks like this (window is a Go duration: "500ms", "1m", "1h"):
//
//	limits:
//	  api:
//	    limit: 30               # hits per window, 1..2^53
//	    window: 1m              # up to 366 days
//	    algorithm: token_bucket # fixed_window (default), sliding_window, token_bucket, leaky_bucket
//	    burst: 60               # bucket capacity in hits; 0 or absent: limit
//	    overrides:
//	      - key_prefix: "tier:pro:"
//	        limit: 300          # fields left out are the limit's own (burst: its own limit when it sets limit)
//	  auth.signup:
//	    limit: 5
//	    window: 1h
//	    shadow: true            # never denies; would-be denials are reported
//	    on_owner_unavailable: deny # local, allow or deny: when the key's owner cannot be reached
//	    scope: exact            # with several regions: global (default: per-region slices), regional or exact
//
// A [Source] holds the file's current [Set] and reloads it atomically: a
// file that does not parse is refused with an error naming its line, and
// the running Set stays.
package limits

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// Limit is the numbers a check gets from a named limit.
type Limit struct {
	// Algorithm decides how hits are counted; never window.Unspecified.
	Algorithm window.Algorithm
	// Limit is the hits allowed per Window.
	Limit int64
	// Window is the period Limit applies to.
	Window time.Duration
	// Burst is the bucket capacity in hits for the bucket algorithms; 0
	// means Limit.
	Burst int64
	// Shadow makes the limit report would-be denials without denying.
	Shadow bool
	// OnOwnerUnavailable is what a node answers a check of this limit
	// whose key's owner it cannot reach, when the check does not say
	// (on_owner_unavailable in the file; an override that leaves it out
	// has its limit's own). OwnerUnavailableUnset when the file does not
	// say either: the node's default, local.
	OnOwnerUnavailable OwnerUnavailable
	// Scope is where the limit is enforced in a cluster of several
	// regions (scope in the file: global, regional or exact; an override
	// that leaves it out has its limit's own). region.Unspecified when
	// the file does not say: global with several regions.
	Scope region.Scope
}

// OwnerUnavailable is a limit's policy for checks whose key's owner a
// node cannot reach: the limits file's on_owner_unavailable, the API's
// RateLimitCheck.on_owner_unavailable. Every such answer is marked
// degraded.
type OwnerUnavailable int

// The policies. Their order is that of the API's OwnerUnavailablePolicy,
// but convert them by name, not by number.
const (
	// OwnerUnavailableUnset: the file does not say; a check then gets the
	// node's default, local.
	OwnerUnavailableUnset OwnerUnavailable = iota
	// OwnerUnavailableLocal decides from the answering node's copy of the
	// key (on_owner_unavailable: local).
	OwnerUnavailableLocal
	// OwnerUnavailableAllow allows the check, counting nothing
	// (on_owner_unavailable: allow; fail open).
	OwnerUnavailableAllow
	// OwnerUnavailableDeny denies the check, counting nothing
	// (on_owner_unavailable: deny; fail closed).
	OwnerUnavailableDeny
)

// ParseOwnerUnavailable returns the policy called s: "local", "allow" or
// "deny" ("" is OwnerUnavailableUnset), or an error naming the valid ones.
func ParseOwnerUnavailable(s string) (OwnerUnavailable, error) {
	switch s {
	case "":
		return OwnerUnavailableUnset, nil
	case "local":
		return OwnerUnavailableLocal, nil
	case "allow":
		return OwnerUnavailableAllow, nil
	case "deny":
		return OwnerUnavailableDeny, nil
	}
	return OwnerUnavailableUnset, fmt.Errorf("must be local, allow or deny, got %q", s)
}

// String returns "local", "allow", "deny", or "" for OwnerUnavailableUnset.
func (o OwnerUnavailable) String() string {
	switch o {
	case OwnerUnavailableLocal:
		return "local"
	case OwnerUnavailableAllow:
		return "allow"
	case OwnerUnavailableDeny:
		return "deny"
	case OwnerUnavailableUnset:
		return ""
	}
	return fmt.Sprintf("OwnerUnavailable(%d)", int(o))
}

// Named is one configured limit: its own numbers and its overrides.
type Named struct {
	// Name is the limit's name, as checks give it.
	Name string
	// Default is what a key that matches no override gets.
	Default Limit
	// Overrides, longest KeyPrefix first: a key gets the first whose
	// prefix it starts with.
	Overrides []Override
}

// Override gives the keys that start with KeyPrefix other numbers.
type Override struct {
	// KeyPrefix is matched against the start of the check's key, byte for
	// byte; never empty.
	KeyPrefix string
	// Limit is the numbers, the named limit's own where the file left a
	// field out.
	Limit Limit
	// Line is the override's line in the file, for messages.
	Line int
}

// Set is one parsed limits file. It is immutable and safe for concurrent
// use. The zero value (and nil) holds no limits.
type Set struct {
	byName map[string]*Named
	names  []string
	// declared: the file has a limits: key (possibly empty), as opposed to
	// an empty or comment-only file (see Source.Reload).
	declared bool
}

// Bounds on names and prefixes: longer ones could never match a check
// (the API takes names up to 256 bytes and keys up to 512 bytes).
const (
	maxNameBytes   = 256
	maxPrefixBytes = 512
)

// Resolve returns the numbers of the limit called name for key: the first
// override (longest prefix first) whose prefix key starts with, else the
// limit's own. ok is false when no limit of that name is configured.
func (s *Set) Resolve(name, key string) (l Limit, ok bool) {
	if s == nil {
		return Limit{}, false
	}
	n, ok := s.byName[name]
	if !ok {
		return Limit{}, false
	}
	for _, o := range n.Overrides {
		if strings.HasPrefix(key, o.KeyPrefix) {
			return o.Limit, true
		}
	}
	return n.Default, true
}

// Has reports whether a limit called name is configured.
func (s *Set) Has(name string) bool {
	if s == nil {
		return false
	}
	_, ok := s.byName[name]
	return ok
}

// Get returns the limit called name, or nil.
func (s *Set) Get(name string) *Named {
	if s == nil {
		return nil
	}
	return s.byName[name]
}

// Names returns the configured names, sorted.
func (s *Set) Names() []string {
	if s == nil {
		return nil
	}
	return append([]string(nil), s.names...)
}

// ErrInvalid is wrapped by every error that refuses a limits file.
var ErrInvalid = errors.New("invalid limits file")

// Load reads and parses the file at path (see [Parse]).
func Load(path string) (*Set, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse parses a limits file; file names it in errors. An error wraps
// [ErrInvalid] and reads "FILE:LINE: PATH: REASON", e.g.
// `limits.yaml:4: limits.api.limit: must be > 0, got 0`. An empty file is
// an empty Set.
func Parse(file string, data []byte) (*Set, error) {
	p := parser{file: file}
	set := &Set{byName: map[string]*Named{}}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) { // no document at all
			return set, nil
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, file, err)
	}
	if len(doc.Content) == 0 {
		return set, nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, fmt.Errorf("%w: %s:%d: a second YAML document (---): one file holds one", ErrInvalid, file, extra.Line)
	}
	root := doc.Content[0]
	if err := p.mapping(root, "", func(k, v *yaml.Node, path string) error {
		if k.Value != "limits" {
			return p.errf(k, path, "unknown field (want limits)")
		}
		set.declared = true
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			return nil // "limits:" with nothing under it: none
		}
		return p.mapping(v, path, func(k, v *yaml.Node, path string) error {
			if k.Value == "" {
				return p.errf(k, path, "a limit's name must not be empty")
			}
			if len(k.Value) > maxNameBytes {
				return p.errf(k, path, "a limit's name must be at most %d bytes, got %d", maxNameBytes, len(k.Value))
			}
			n, err := p.named(k.Value, v, path)
			if err != nil {
				return err
			}
			set.byName[n.Name] = n
			set.names = append(set.names, n.Name)
			return nil
		})
	}); err != nil {
		return nil, err
	}
	sort.Strings(set.names)
	return set, nil
}

type parser struct{ file string }

func (p *parser) errf(n *yaml.Node, path, format string, args ...any) error {
	return fmt.Errorf("%w: %s:%d: %s: %s", ErrInvalid, p.file, n.Line, path, fmt.Sprintf(format, args...))
}

// mapping calls f for each key and value of mapping node n; path is n's
// dotted path.
func (p *parser) mapping(n *yaml.Node, path string, f func(k, v *yaml.Node, path string) error) error {
	if n.Kind != yaml.MappingNode {
		return p.errf(n, orRoot(path), "must be a mapping")
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if line, dup := seen[k.Value]; dup {
			sub := k.Value
			if path != "" {
				sub = path + "." + k.Value
			}
			return p.errf(k, sub, "given twice (also on line %d)", line)
		}
		seen[k.Value] = k.Line
		sub := k.Value
		if path != "" {
			sub = path + "." + k.Value
		}
		if err := f(k, v, sub); err != nil {
			return err
		}
	}
	return nil
}

func orRoot(path string) string {
	if path == "" {
		return "(top level)"
	}
	return path
}

// fields is a limit's or an override's numbers as written; nil is absent.
type fields struct {
	algorithm *window.Algorithm
	limit     *int64
	window    *time.Duration
	burst     *int64
	shadow    *bool
	onOwner   *OwnerUnavailable
	scope     *region.Scope
	line      int
}

// field decodes one of the numbers' fields; it reports false for a key
// that is not one of them.
func (p *parser) field(k, v *yaml.Node, path string, f *fields) (bool, error) {
	scalar := func(out any) error {
		if v.Kind != yaml.ScalarNode {
			return p.errf(v, path, "must be a single value")
		}
		if err := v.Decode(out); err != nil {
			want := "a string"
			switch out.(type) {
			case *int64:
				want = "a whole number"
			case *bool:
				want = "true or false"
			}
			return p.errf(v, path, "must be %s, got %q", want, v.Value)
		}
		return nil
	}
	switch k.Value {
	case "algorithm":
		var s string
		if err := scalar(&s); err != nil {
			return true, err
		}
		a, err := window.ParseAlgorithm(s)
		if err != nil {
			var fe *window.FieldError
			if errors.As(err, &fe) {
				return true, p.errf(v, path, "%s", fe.Reason)
			}
			return true, p.errf(v, path, "%v", err)
		}
		f.algorithm = &a
	case "limit", "burst":
		var n int64
		if err := scalar(&n); err != nil {
			return true, err
		}
		if k.Value == "limit" {
			f.limit = &n
		} else {
			f.burst = &n
		}
	case "window":
		var s string
		if err := scalar(&s); err != nil {
			return true, err
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return true, p.errf(v, path, "not a duration (want e.g. 500ms, 1m, 1h): %q", s)
		}
		f.window = &d
	case "shadow":
		var b bool
		if err := scalar(&b); err != nil {
			return true, err
		}
		f.shadow = &b
	case "on_owner_unavailable":
		var s string
		if err := scalar(&s); err != nil {
			return true, err
		}
		o, err := ParseOwnerUnavailable(s)
		if err != nil || o == OwnerUnavailableUnset {
			return true, p.errf(v, path, "must be local, allow or deny, got %q", s)
		}
		f.onOwner = &o
	case "scope":
		var s string
		if err := scalar(&s); err != nil {
			return true, err
		}
		sc, err := region.ParseScope(s)
		if err != nil || sc == region.Unspecified {
			return true, p.errf(v, path, "must be global, regional or exact, got %q", s)
		}
		f.scope = &sc
	default:
		return false, nil
	}
	return true, nil
}

// resolve fills the numbers from f over base and validates them; n names
// the node for messages.
func (p *parser) resolve(f fields, base Limit, n *yaml.Node, path string) (Limit, error) {
	l := base
	if f.algorithm != nil {
		l.Algorithm = *f.algorithm
	}
	if f.limit != nil {
		l.Limit = *f.limit
		if f.burst == nil {
			l.Burst = 0 // an override's own limit: its burst is its limit unless it says otherwise
		}
	}
	if f.window != nil {
		l.Window = *f.window
	}
	if f.burst != nil {
		l.Burst = *f.burst
	}
	if f.shadow != nil {
		l.Shadow = *f.shadow
	}
	if f.onOwner != nil {
		l.OnOwnerUnavailable = *f.onOwner
	}
	if f.scope != nil {
		l.Scope = *f.scope
	}
	if l.Algorithm == window.Unspecified {
		l.Algorithm = window.FixedWindow
	}
	switch {
	case f.limit == nil && base.Limit == 0:
		return l, p.errf(n, path, "limit is required")
	case f.window == nil && base.Window == 0:
		return l, p.errf(n, path, "window is required")
	}
	if l.Burst > 0 && f.burst != nil && l.Algorithm != window.TokenBucket && l.Algorithm != window.LeakyBucket {
		return l, p.errf(n, path+".burst", "applies to token_bucket and leaky_bucket only, not %s", l.Algorithm)
	}
	if l.Window%time.Millisecond != 0 {
		return l, p.errf(n, path+".window", "must be a whole number of milliseconds, got %s", l.Window)
	}
	if err := (window.Check{Algorithm: l.Algorithm, Limit: l.Limit, Window: l.Window, Burst: l.Burst, Hits: 1}).Validate(); err != nil {
		var fe *window.FieldError
		if errors.As(err, &fe) {
			return l, p.errf(n, path+"."+fe.Field, "%s", fe.Reason)
		}
		return l, p.errf(n, path, "%v", err)
	}
	return l, nil
}

func (p *parser) named(name string, v *yaml.Node, path string) (*Named, error) {
	var f fields
	var overrides *yaml.Node
	if err := p.mapping(v, path, func(k, v *yaml.Node, sub string) error {
		if k.Value == "overrides" {
			overrides = v
			return nil
		}
		ok, err := p.field(k, v, sub, &f)
		if err == nil && !ok {
			err = p.errf(k, sub, "unknown field (want limit, window, algorithm, burst, shadow, on_owner_unavailable, scope or overrides)")
		}
		return err
	}); err != nil {
		return nil, err
	}
	def, err := p.resolve(f, Limit{}, v, path)
	if err != nil {
		return nil, err
	}
	n := &Named{Name: name, Default: def}
	if overrides == nil {
		return n, nil
	}
	opath := path + ".overrides"
	if overrides.Kind != yaml.SequenceNode {
		return nil, p.errf(overrides, opath, "must be a list")
	}
	seen := map[string]int{}
	for i, on := range overrides.Content {
		ipath := fmt.Sprintf("%s[%d]", opath, i)
		var of fields
		prefix, hasPrefix := "", false
		if err := p.mapping(on, ipath, func(k, v *yaml.Node, sub string) error {
			if k.Value == "key_prefix" {
				if v.Kind != yaml.ScalarNode {
					return p.errf(v, sub, "must be a single value")
				}
				prefix, hasPrefix = v.Value, true
				return nil
			}
			ok, err := p.field(k, v, sub, &of)
			if err == nil && !ok {
				err = p.errf(k, sub, "unknown field (want key_prefix, limit, window, algorithm, burst, shadow, on_owner_unavailable or scope)")
			}
			return err
		}); err != nil {
			return nil, err
		}
		if !hasPrefix || prefix == "" {
			return nil, p.errf(on, ipath+".key_prefix", "required and not empty")
		}
		if len(prefix) > maxPrefixBytes {
			return nil, p.errf(on, ipath+".key_prefix", "must be at most %d bytes, got %d", maxPrefixBytes, len(prefix))
		}
		if line, dup := seen[prefix]; dup {
			return nil, p.errf(on, ipath+".key_prefix", "%q is already overridden on line %d", prefix, line)
		}
		seen[prefix] = on.Line
		l, err := p.resolve(of, def, on, ipath)
		if err != nil {
			return nil, err
		}
		n.Overrides = append(n.Overrides, Override{KeyPrefix: prefix, Limit: l, Line: on.Line})
	}
	sort.SliceStable(n.Overrides, func(i, j int) bool { return len(n.Overrides[i].KeyPrefix) > len(n.Overrides[j].KeyPrefix) })
	return n, nil
}
