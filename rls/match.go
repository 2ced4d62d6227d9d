package rls

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// Entry is one key/value pair of a request's descriptor, e.g.
// ("remote_address", "10.0.0.1").
type Entry struct {
	Key, Value string
}

// Match is the rule a descriptor matched and the sluice check it becomes.
type Match struct {
	// Rule is the matched rule.
	Rule *Rule
	// Name and Key are the sluice check's name (the domain and the matched
	// rule's path) and key (the descriptor's values; the wildcard pattern
	// instead of the value for an entry matched by a share_threshold
	// wildcard). Both are hashed when longer than sluice accepts (256 and
	// 512 bytes).
	Name, Key string
}

// Match finds the rule for one descriptor of a request to domain, as
// envoyproxy/ratelimit does. Level by level, each entry is matched against
// the descriptors of that level: first the same key and value, then the
// same key with a wildcard value (in file order; "*" matches any run of
// characters, so "foo*" matches every value that starts with "foo"), then
// the same key without a value (which matches any value, each value
// counted on its own). A rule applies only when the descriptor has exactly
// as many entries as the rule's depth. It returns false for an unknown
// domain or when no rule applies. It is safe for concurrent use.
func (c *Config) Match(domain string, entries []Entry) (Match, bool) {
	if c == nil {
		return Match{}, false
	}
	level := c.domains[domain]
	if level == nil || len(entries) == 0 {
		return Match{}, false
	}
	var (
		rule *Rule
		key  strings.Builder
	)
	for i, e := range entries {
		next := level.exact[pair{e.Key, e.Value}]
		viaWildcard := false
		if next == nil {
			for _, w := range level.wild {
				if w.key == e.Key && globMatch(w.value, e.Value) {
					next, viaWildcard = w, true
					break
				}
			}
		}
		if next == nil {
			next = level.byKey[e.Key]
		}
		if next == nil {
			break
		}
		if i > 0 {
			key.WriteByte(' ')
		}
		if viaWildcard && next.shareThreshold {
			// Every value the pattern matches shares one count.
			key.WriteByte('*')
			key.WriteString(strconv.Quote(next.value))
		} else {
			key.WriteString(strconv.Quote(e.Value))
		}
		if next.rule != nil && i == len(entries)-1 {
			rule = next.rule
		}
		if !next.hasChildren() {
			break
		}
		level = next
	}
	if rule == nil {
		return Match{}, false
	}
	k := key.String()
	if len(k) > maxKeyBytes {
		k = hashed(k)
	}
	return Match{Rule: rule, Name: rule.checkName, Key: k}, true
}

// hashed returns "#" and the hex SHA-256 of s: a key within sluice's
// limits that no quoted key can equal.
func hashed(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "#" + hex.EncodeToString(sum[:])
}

// globMatch reports whether s matches pattern, where each '*' matches any
// run of bytes (possibly empty) and every other byte matches itself.
func globMatch(pattern, s string) bool {
	// Greedy with backtracking to the last star: linear in practice.
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case p < len(pattern) && pattern[p] == s[i]:
			p++
			i++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
