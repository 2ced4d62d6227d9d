package proxyrules

import "testing"

// canonicalPath, case by case.
func TestCanonicalPath(t *testing.T) {
	for _, tc := range []struct {
		in   string
		fold bool
		want string
	}{
		{"/auth/login", true, "/auth/login"},
		{"/auth/login/", true, "/auth/login"},
		{"//auth//login", true, "/auth/login"},
		{"/auth/./login", true, "/auth/login"},
		{"/AUTH/Login", true, "/auth/login"},
		{"/AUTH/Login", false, "/AUTH/Login"},
		{"/auth/login;x=1", true, "/auth/login"},
		{"/auth;x/login", true, "/auth/login"},
		{"/auth/login \t", true, "/auth/login"},
		{`/auth\login`, true, "/auth/login"},
		{"/a/..;/auth/login", true, "/auth/login"},
		{"/../../auth/login", true, "/auth/login"},
		{"", true, "/"},
		{"*", true, "/*"},
		{"/", true, "/"},
	} {
		if got := canonicalPath(tc.in, tc.fold); got != tc.want {
			t.Errorf("canonicalPath(%q, %v) = %q, want %q", tc.in, tc.fold, got, tc.want)
		}
	}
}
