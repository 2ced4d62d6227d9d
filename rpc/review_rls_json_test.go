package rpc

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/internal/certs"
	"github.com/sluicehq/sluice/rls"
)

// reviewRLSRules is the rule file of the /json tests: key k, 5 a minute.
const reviewRLSRules = "domain: d\ndescriptors:\n  - key: k\n    metadata: {team: web}\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"

func reviewRLSConfig(t *testing.T, rules string) *rls.Config {
	t.Helper()
	cfg, err := rls.Parse(rls.File{Name: "d.yaml", Data: []byte(rules)})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// reviewPost posts body to url's /json through hc (default client when
// nil), with the bearer token when not empty, and returns the status
// and the body.
func reviewPost(t *testing.T, hc *http.Client, url, token, body string) (int, string) {
	t.Helper()
	if hc == nil {
		hc = http.DefaultClient
	}
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Holds (pinned): bad bodies of POST /json are 400 naming what is wrong
// (413 past MaxHTTPBodyBytes), never a panic or a 500; a hits_addend of
// 2^64-1 is a refusal (429), not a wrap; the node keeps answering.
func TestReviewRLSJSONBadInput(t *testing.T) {
	n := startNodeWith(t, "json", windowClock(), NodeConfig{HTTPAddr: "127.0.0.1:0", RLS: reviewRLSConfig(t, reviewRLSRules)})
	url := "http://" + n.HTTPAddr() + "/json"
	okDesc := `{"entries":[{"key":"k","value":"v"}]}`
	many := strings.TrimSuffix(strings.Repeat(okDesc+",", 1001), ",")
	bigValue := strings.Repeat("x", MaxHTTPBodyBytes)
	for _, c := range []struct {
		what, body string
		code       int
		says       string // in the answer's body
	}{
		{"not JSON", `{"domain":`, 400, "body: not a RateLimitRequest"},
		{"empty body", ``, 400, "body: not a RateLimitRequest"},
		{"null", `null`, 400, "body: not a RateLimitRequest"},
		{"an array", `[]`, 400, "body: not a RateLimitRequest"},
		{"unknown field", `{"domain":"d","descriptors":[` + okDesc + `],"bogus":1}`, 400, `unknown field "bogus"`},
		{"unknown nested field", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v","x":1}]}]}`, 400, `unknown field "x"`},
		{"domain a number", `{"domain":5,"descriptors":[` + okDesc + `]}`, 400, "domain"},
		{"descriptors an object", `{"domain":"d","descriptors":{}}`, 400, "body: not a RateLimitRequest"},
		{"negative hitsAddend", `{"domain":"d","descriptors":[` + okDesc + `],"hitsAddend":-1}`, 400, "hitsAddend"},
		{"hitsAddend past uint32", `{"domain":"d","descriptors":[` + okDesc + `],"hitsAddend":4294967296}`, 400, "hitsAddend"},
		{"hitsAddend 1e999", `{"domain":"d","descriptors":[` + okDesc + `],"hitsAddend":1e999}`, 400, "hitsAddend"},
		{"negative descriptor hitsAddend", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":-1}]}`, 400, "body: not a RateLimitRequest"},
		{"duplicate field", `{"domain":"d","domain":"e","descriptors":[` + okDesc + `]}`, 400, "domain"},
		{"no domain", `{"descriptors":[` + okDesc + `]}`, 400, "domain: must not be empty"},
		{"no descriptors", `{"domain":"d"}`, 400, "descriptors: must not be empty"},
		{"1001 descriptors", `{"domain":"d","descriptors":[` + many + `]}`, 400, "descriptors: at most 1000, got 1001"},
		{"override unit by name", `{"domain":"d","descriptors":[{"entries":[{"key":"o","value":"v"}],"limit":{"requestsPerUnit":1,"unit":"FORTNIGHT"}}]}`, 400, "unit"},
		{"override unit 99", `{"domain":"d","descriptors":[{"entries":[{"key":"o","value":"v"}],"limit":{"requestsPerUnit":1,"unit":99}}]}`, 400, "descriptors[0].limit.unit: unknown unit 99"},
		{"override unit UNKNOWN", `{"domain":"d","descriptors":[{"entries":[{"key":"o","value":"v"}],"limit":{"requestsPerUnit":1,"unit":"UNKNOWN"}}]}`, 400, "descriptors[0].limit.unit"},
		{"override window past 366 days", `{"domain":"d","descriptors":[{"entries":[{"key":"o","value":"v"}],"limit":{"requestsPerUnit":1,"unit":"YEAR","unitMultiplier":2}}]}`, 400, "descriptors[0].limit.unit_multiplier"},
		{"override negative requestsPerUnit", `{"domain":"d","descriptors":[{"entries":[{"key":"o","value":"v"}],"limit":{"requestsPerUnit":-1,"unit":"SECOND"}}]}`, 400, "requestsPerUnit"},
		{"invalid UTF-8", "{\"domain\":\"d\",\"descriptors\":[{\"entries\":[{\"key\":\"k\",\"value\":\"\xff\"}]}]}", 400, "UTF-8"},
		{"nested 20000 deep", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":` + strings.Repeat(`{"a":`, 20000) + strings.Repeat("}", 20000) + `}]}`, 400, "body: not a RateLimitRequest"},
		{"body past 1 MiB", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"` + bigValue + `"}]}]}`, 413, "body: at most"},
		{"hits_addend 2^64-1", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"huge"}],"hitsAddend":"18446744073709551615"}]}`, 429, `"overallCode":"OVER_LIMIT"`},
		{"a long key and value", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"` + strings.Repeat("é", 5000) + `"}]}]}`, 200, `"overallCode":"OK"`},
		{"an override on an unknown domain", `{"domain":"nope","descriptors":[{"entries":[{"key":"o","value":"v"}],"limit":{"requestsPerUnit":1,"unit":"FORTNIGHT"}}]}`, 400, "unit"},
	} {
		code, body := reviewPost(t, nil, url, "", c.body)
		if code != c.code || !strings.Contains(body, c.says) {
			if len(body) > 300 {
				body = body[:300] + "..."
			}
			t.Errorf("%s: %d %q, want %d containing %q", c.what, code, body, c.code, c.says)
		}
	}
	if code, body := reviewPost(t, nil, url, "", `{"domain":"d","descriptors":[`+okDesc+`]}`); code != 200 {
		t.Errorf("a good request after the bad ones: %d %s", code, body)
	}
}

// Finding (low): a 400 of /json for a body that is not a
// RateLimitRequest carries protojson's message, which names the field
// for most errors but not all: descriptors given as an object is
// "syntax error (line 1:29): unexpected token {", a negative descriptor
// hits_addend is "invalid value for uint64 field value: -1" (the
// wrapper's inner field, not hitsAddend), invalid UTF-8 names only a
// line and column. The status (400) is right. Right: name the field
// (descriptors, descriptors[0].hitsAddend), e.g. from the position.
func TestReviewRLSJSONErrorsNameTheField(t *testing.T) {
	t.Skip("finding: some /json 400s do not name the field: descriptors as an object (\"unexpected token {\"), a negative descriptor hitsAddend (\"uint64 field value\"), invalid UTF-8 (line and column only)")
	n := startNodeWith(t, "json", windowClock(), NodeConfig{HTTPAddr: "127.0.0.1:0", RLS: reviewRLSConfig(t, reviewRLSRules)})
	url := "http://" + n.HTTPAddr() + "/json"
	for _, c := range []struct{ what, body, field string }{
		{"descriptors an object", `{"domain":"d","descriptors":{}}`, "descriptors"},
		{"negative descriptor hitsAddend", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":-1}]}`, "hitsAddend"},
		{"invalid UTF-8 in a value", "{\"domain\":\"d\",\"descriptors\":[{\"entries\":[{\"key\":\"k\",\"value\":\"\xff\"}]}]}", "value"},
	} {
		if code, body := reviewPost(t, nil, url, "", c.body); code != 400 || !strings.Contains(body, c.field) {
			t.Errorf("%s: %d %q, want 400 naming %s", c.what, code, body, c.field)
		}
	}
}

// Finding (medium for the HTTP face): with dynamic metadata on, a rule whose metadata holds .nan (which
// the rule loader accepts, see rls TestReviewMetadataNaNRefused) makes
// protojson.Marshal of every response that passes the rule fail, and
// /json answers 500 "proto: google.protobuf.Value.number_value: invalid
// NaN value" to every such request, while gRPC answers it. Right: refuse
// the metadata at load (a ConfigError naming descriptors[0].metadata),
// or answer /json without it; never a 500 to a good request.
func TestReviewRLSJSONNaNMetadata(t *testing.T) {
	rules := "domain: d\ndescriptors:\n  - key: k\n    metadata: {score: .nan}\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
	cfg, err := rls.Parse(rls.File{Name: "d.yaml", Data: []byte(rules)})
	if err != nil {
		return // refused at load: the right behaviour
	}
	n := startNodeWith(t, "nan", windowClock(), NodeConfig{HTTPAddr: "127.0.0.1:0", RLS: cfg, RLSOptions: rls.Options{DynamicMetadata: true}})
	code, body := reviewPost(t, nil, "http://"+n.HTTPAddr()+"/json", "", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`)
	if code != 200 {
		t.Errorf("a good request passing a rule whose metadata holds NaN: %d %q, want 200", code, body)
	}
}

// reviewHTTPS is an HTTPS client trusting p's CA, presenting the client
// certificate certFile/keyFile (none when certFile is "").
func reviewHTTPS(t *testing.T, p *testPKI, certFile, keyFile string) *http.Client {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: p.clientTLS(t, certFile, keyFile), ForceAttemptHTTP2: true}, Timeout: 10 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// Holds (pinned): on a node with TLS and client auth, POST /json takes
// what the gRPC ShouldRateLimit takes: a client certificate (mtls,
// either) or a token with the prefix "*" (token, either); no
// credentials, an unknown token, a token without "*", or a token on an
// mtls node are refused (401, 403) and count nothing; GET /healthcheck
// and gRPC health "ratelimit" answer without credentials; path tricks
// around /healthcheck do not reach /json unauthenticated.
func TestReviewRLSJSONSecured(t *testing.T) {
	p := newPKI(t)
	tokens := writeTokens(t) // tokenAPI: api auth. ; tokenAll: *
	cc, ck := p.issue(t, certs.Client, "envoy")
	good := `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"%s"}]}]}`
	for _, mode := range []ClientAuth{ClientAuthEither, ClientAuthToken, ClientAuthMTLS} {
		t.Run(string(mode), func(t *testing.T) {
			cfg := NodeConfig{HTTPAddr: "127.0.0.1:0", RLS: reviewRLSConfig(t, reviewRLSRules), ClientAuth: mode}
			if mode != ClientAuthMTLS {
				cfg.TokenFile = tokens
			}
			n := startTLSNode(t, p, "sec", cfg)
			base := "https://" + n.HTTPAddr()
			anon, withCert := reviewHTTPS(t, p, "", ""), reviewHTTPS(t, p, cc, ck)
			key := "k-" + string(mode)
			for _, c := range []struct {
				what  string
				hc    *http.Client
				token string
				want  int
			}{
				{"no credentials", anon, "", 401},
				{"an unknown token", anon, "tok-nope-0123456789abcdef", 401},
				{"a token without *", anon, tokenAPI, map[ClientAuth]int{ClientAuthMTLS: 401, ClientAuthToken: 403, ClientAuthEither: 403}[mode]},
				{"a token with *", anon, tokenAll, map[ClientAuth]int{ClientAuthMTLS: 401, ClientAuthToken: 200, ClientAuthEither: 200}[mode]},
				{"a client certificate", withCert, "", map[ClientAuth]int{ClientAuthMTLS: 200, ClientAuthToken: 401, ClientAuthEither: 200}[mode]},
			} {
				code, body := reviewPost(t, c.hc, base+"/json", c.token, fmt.Sprintf(good, key))
				if code != c.want {
					t.Errorf("/json with %s: %d %q, want %d", c.what, code, body, c.want)
				}
			}
			// Only the accepted calls counted: a peek-free look at the
			// count through an accepted caller.
			accepted := map[ClientAuth]int{ClientAuthMTLS: 1, ClientAuthToken: 1, ClientAuthEither: 2}[mode]
			hc, tok := withCert, ""
			if mode == ClientAuthToken {
				hc, tok = anon, tokenAll
			}
			_, body := reviewPost(t, hc, base+"/json", tok, fmt.Sprintf(good, key))
			var resp rlsv3.RateLimitResponse
			if err := protojson.Unmarshal([]byte(body), &resp); err != nil {
				t.Fatalf("%s: %v", body, err)
			}
			if got, want := resp.Statuses[0].GetLimitRemaining(), uint32(5-accepted-1); got != want {
				t.Errorf("remaining after %d accepted calls and this one: %d, want %d (a refused call counted)", accepted, got, want)
			}
			for _, path := range []string{"/healthcheck", "/healthz"} {
				resp, err := anon.Get(base + path)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("GET %s without credentials: %d %q, want 200", path, resp.StatusCode, b)
				}
				if path == "/healthcheck" && string(b) != "OK" {
					t.Errorf("GET /healthcheck: %q, want OK", b)
				}
			}
			for _, path := range []string{"/healthcheck/../json", "/healthcheck/%2e%2e/json", "//json", "/json/", "/./json", "/healthcheck?/json"} {
				code, body := reviewPost(t, anon, base+path, "", fmt.Sprintf(good, key))
				if code == 200 || code == 429 || code >= 500 {
					t.Errorf("POST %s without credentials: %d %q, want a refusal", path, code, body)
				}
			}
			// gRPC: health "ratelimit" open (but for the TLS handshake,
			// which an mtls node's gRPC port makes need a certificate),
			// ShouldRateLimit as /json.
			tc := p.clientTLS(t, "", "")
			if mode == ClientAuthMTLS {
				tc = p.clientTLS(t, cc, ck)
			}
			conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rls.HealthName})
			if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("gRPC health %q without credentials: %v %v", rls.HealthName, h, err)
			}
			if mode != ClientAuthMTLS {
				tconn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(tc)), grpc.WithPerRPCCredentials(bearerCreds(tokenAPI)))
				if err != nil {
					t.Fatal(err)
				}
				defer tconn.Close()
				_, err = rlsv3.NewRateLimitServiceClient(tconn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
				if status.Code(err) != codes.PermissionDenied {
					t.Errorf("gRPC ShouldRateLimit with a token without *: %v, want PermissionDenied", err)
				}
			}
		})
	}
}
