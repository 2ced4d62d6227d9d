package security

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/certs"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// With refunds on (serve --allow-refunds) a refund (negative hits) needs
// a token with the prefix "*" or a client certificate: a token limited to
// prefixes may not lift its own limits, even of names it covers. With
// refunds off the authenticator lets negative hits through to the node,
// which refuses them itself (INVALID_ARGUMENT), as before refunds.
func TestAuthorizeRefunds(t *testing.T) {
	check := sluicev1.RateLimitService_Check_FullMethodName
	off := newAuth(t, ClientAuthEither, true)
	on := newAuth(t, ClientAuthEither, true)
	on.cfg.Refunds = true
	api, all := on.cfg.Tokens.lookup(tokenAPI), on.cfg.Tokens.lookup(tokenAll)
	client := principal{kind: certs.Client, name: "app", cert: true}
	refund := func(names ...string) *sluicev1.CheckRequest {
		req := checkReq(names...)
		req.Checks[len(names)-1].Hits = proto.Int64(-2)
		return req
	}
	charge := checkReq("api")
	charge.Checks[0].Hits = proto.Int64(2)
	for _, tc := range []struct {
		what string
		a    *Authenticator
		pr   principal
		req  *sluicev1.CheckRequest
		want codes.Code
	}{
		{"on, a prefix token's refund", on, principal{token: api}, refund("api"), codes.PermissionDenied},
		{"on, a prefix token's refund second in a batch", on, principal{token: api}, refund("api", "auth.signin"), codes.PermissionDenied},
		{"on, a prefix token's charge", on, principal{token: api}, charge, codes.OK},
		{"on, a * token's refund", on, principal{token: all}, refund("api"), codes.OK},
		{"on, a client certificate's refund", on, client, refund("billing"), codes.OK},
		{"off, a prefix token's refund (the node refuses it)", off, principal{token: api}, refund("api"), codes.OK},
		{"on, a refund outside the prefixes", on, principal{token: api}, refund("billing"), codes.PermissionDenied},
	} {
		err := tc.a.authorize(check, tc.pr, tc.req)
		if got := status.Code(err); got != tc.want {
			t.Errorf("%s: %v, want %s", tc.what, err, tc.want)
		}
	}
	err := on.authorize(check, principal{token: api}, refund("api", "auth.signin"))
	if msg := status.Convert(err).Message(); !strings.HasPrefix(msg, "checks[1].hits: ") || !strings.Contains(msg, `prefix "*"`) {
		t.Errorf("the refusal %q: want it to name checks[1].hits and the prefix *", msg)
	}
}
