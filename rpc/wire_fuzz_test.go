package rpc

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// fuzzServer is a one-node Server on a manual clock, with the named
// limits of testLimits; no network.
func fuzzServer(t *testing.T) *Server {
	set := mustParseLimits(t, testLimits)
	s, err := NewServer(ServerConfig{
		Name:   "fuzz",
		Store:  window.NewStore(window.StoreConfig{Clock: windowClock(), MaxKeys: 10_000}),
		Logger: testLogger(),
		Limits: set,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// FuzzCheck sends one check with arbitrary fields, twice, through Check
// (validation, named limits, the window): it never panics; a refusal is
// INVALID_ARGUMENT naming a field of checks[0]; an answer has no negative
// number but retry_after -1, remaining at most the limit's capacity, and
// allowed only with retry_after 0 (C12).
func FuzzCheck(f *testing.F) {
	f.Add("api", "user:1", int64(1), true, int64(10), int64(60_000), int64(0), int32(1))
	f.Add("api", "vip:2", int64(0), false, int64(0), int64(0), int64(0), int32(0))
	f.Add("signup", "ip", int64(3), true, int64(0), int64(0), int64(0), int32(0))
	f.Add("x", "", int64(-1), true, int64(-1), int64(-5000), int64(-1), int32(9))
	f.Add("big", "k", int64(1<<53), true, int64(1<<53), int64(31_622_400_000), int64(1<<53), int32(3))
	f.Fuzz(func(t *testing.T, name, key string, hits int64, hasHits bool, limit, windowMs, burst int64, alg int32) {
		s := fuzzServer(t)
		defer s.Close()
		rc := &sluicev1.RateLimitCheck{Name: name, Key: key, Limit: limit, WindowMs: windowMs, Burst: burst, Algorithm: sluicev1.Algorithm(alg)}
		if hasHits {
			rc.Hits = proto.Int64(hits)
		}
		for range 2 {
			resp, err := s.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc}})
			if err != nil {
				if status.Code(err) != codes.InvalidArgument || !bytes.HasPrefix([]byte(status.Convert(err).Message()), []byte("checks[0].")) {
					t.Fatalf("%v: refused with %v", rc, err)
				}
				return
			}
			d := resp.Decisions[0]
			capacity := d.Limit
			if b := rc.Burst; b > 0 && (rc.Algorithm == sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET || rc.Algorithm == sluicev1.Algorithm_ALGORITHM_LEAKY_BUCKET) {
				capacity = b
			}
			switch {
			case d.Error != "":
				t.Fatalf("%v: per-check error %s", rc, d.Error)
			case d.Remaining < 0 || d.ResetTime < 0 || d.Delay < 0 || d.RetryAfter < -1 || d.Limit <= 0:
				t.Fatalf("%v: a negative number in %v", rc, d)
			case d.Remaining > capacity:
				t.Fatalf("%v: remaining %d over capacity %d", rc, d.Remaining, capacity)
			case d.Allowed && d.RetryAfter != 0:
				t.Fatalf("%v: allowed with retry_after %d", rc, d.RetryAfter)
			}
		}
	})
}

// FuzzHTTPCheck posts arbitrary bodies to /v1/check (no network: the
// handler is called directly): it never panics and answers 200, 400 or
// 413, never a server error.
func FuzzHTTPCheck(f *testing.F) {
	f.Add([]byte(`{"checks":[{"name":"api","key":"u","limit":3,"window_ms":"60000"}]}`))
	f.Add([]byte(`{"checks":[{"name":"api","key":"u"}]}`))
	f.Add([]byte(`{"checks":[{"name":"api","key":"u","limit":-1,"window_ms":1000,"algorithm":"ALGORITHM_LEAKY_BUCKET"}]}`))
	f.Add([]byte(`{"checks":[`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, body []byte) {
		s := fuzzServer(t)
		defer s.Close()
		h, err := NewHTTPHandler(HTTPConfig{Server: s})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/check", bytes.NewReader(body)))
		switch rec.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("POST /v1/check %q: %d %s", body, rec.Code, rec.Body)
		}
	})
}
