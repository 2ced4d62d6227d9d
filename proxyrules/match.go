package proxyrules

import (
	"fmt"
	"net/http"
	"path"
	"strings"
	"unicode"
)

// Match returns the index in rs.Rules of the rule a request is checked
// by: the first, in file order, whose match: the request meets; -1 when
// the request is exempt (exempt:, default OPTIONS) or no rule matches it,
// so that it goes upstream unchecked. method is the request's method, in
// any case; urlPath is its decoded path (http.Request's URL.Path), which
// Match compares in a canonical form, so that every spelling an upstream
// may route to the same handler meets the same rule: backslashes read as
// slashes, each segment's ";params" and trailing white space dropped, then
// path.Clean, in lower case unless the file sets case_sensitive_paths. A
// GET route also matches HEAD. Match only reads rs: it is safe for
// concurrent use.
func (rs *Rules) Match(method, urlPath string) int {
	method, cpath := strings.ToUpper(method), canonicalPath(urlPath, rs.fold)
	for _, ex := range rs.exempt {
		if ex.matches(method, cpath) {
			return -1
		}
	}
	for i := range rs.Rules {
		if rs.Rules[i].route.matches(method, cpath) {
			return i
		}
	}
	return -1
}

// route is a method (empty: any; upper case) and a path pattern: exact,
// a subtree (ending in "/"), or a path.Match pattern (with "*"); in
// lower case unless paths are case-sensitive.
type route struct {
	method, path string
}

// parseMethod returns m in upper case (methods are accepted in any case
// in the rules file), or an error if it is no HTTP method token.
func parseMethod(m string) (string, error) {
	m = strings.TrimSpace(m)
	if m == "" || strings.IndexFunc(m, func(c rune) bool {
		return c > unicode.MaxASCII || !(unicode.IsLetter(c) || unicode.IsDigit(c) || strings.ContainsRune("!#$%&'*+-.^_`|~", c))
	}) >= 0 {
		return "", fmt.Errorf("%q is no HTTP method", m)
	}
	return strings.ToUpper(m), nil
}

// parseRoute parses "[METHOD ]/PATH"; fold lowers the path (paths are
// compared case-insensitively).
func parseRoute(s string, fold bool) (route, error) {
	s = strings.TrimSpace(s)
	var r route
	if m, p, ok := strings.Cut(s, " "); ok {
		var err error
		if r.method, err = parseMethod(m); err != nil {
			return route{}, fmt.Errorf("%q: %v", s, err)
		}
		r.path = strings.TrimSpace(p)
	} else {
		r.path = s
	}
	if !strings.HasPrefix(r.path, "/") {
		return route{}, fmt.Errorf("%q: want [METHOD ]/PATH, e.g. \"POST /auth/login\"", s)
	}
	if _, err := path.Match(r.path, "/"); err != nil {
		return route{}, fmt.Errorf("%q: bad pattern: %v", s, err)
	}
	if fold {
		r.path = strings.ToLower(r.path)
	}
	return r, nil
}

// matches reports whether a request of method (upper case) to the path p
// (see canonicalPath) is of the route. GET also matches HEAD, as net/http
// and most frameworks route HEAD to GET handlers.
func (rt route) matches(method, p string) bool {
	if rt.method != "" && rt.method != method && !(rt.method == http.MethodGet && method == http.MethodHead) {
		return false
	}
	switch {
	case strings.HasSuffix(rt.path, "/"):
		return strings.HasPrefix(p, rt.path) || p == strings.TrimSuffix(rt.path, "/")
	case strings.Contains(rt.path, "*"):
		ok, _ := path.Match(rt.path, p)
		return ok
	}
	return p == rt.path
}

// canonicalPath returns the path rules are matched against: p (the
// decoded request path) with backslashes as slashes, each segment's
// ";params" and trailing white space dropped, then path.Clean'ed
// (repeated slashes, "." and ".." resolved, no trailing slash), and in
// lower case when fold is set; so that any spelling an upstream may route
// to the same handler (/auth/login/, //auth/login, /auth/./login,
// /auth/login;x, /auth/login%20, /AUTH/LOGIN) meets the same rule. The
// request forwarded upstream is not changed.
func canonicalPath(p string, fold bool) string {
	segs := strings.Split(strings.ReplaceAll(p, "\\", "/"), "/")
	for i, seg := range segs {
		seg, _, _ = strings.Cut(seg, ";")
		segs[i] = strings.TrimRightFunc(seg, unicode.IsSpace)
	}
	p = path.Clean("/" + strings.Join(segs, "/"))
	if fold {
		p = strings.ToLower(p)
	}
	return p
}
