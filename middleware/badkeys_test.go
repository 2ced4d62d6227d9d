package middleware_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/window"
)

// recorder is a Checker that allows everything and records the keys it
// was asked about.
type recorder struct {
	mu   sync.Mutex
	keys []string
}

func (c *recorder) Check(_ context.Context, ch client.Check) (client.Decision, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keys = append(c.keys, ch.Key)
	return client.Decision{Allowed: true, Limit: 10, Remaining: 9}, nil
}

func (c *recorder) sent() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.keys...)
}

// serve runs one request with headers (name, value pairs) through h.
func serve(h http.Handler, method, target, body string, headers ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.RemoteAddr = "192.0.2.7:1"
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// A key that is not valid UTF-8 is never sent (protobuf refuses it and a
// fail-open client would let the request through unlimited): the request
// is answered 400, while the same user spelled validly is limited. Against
// a real node with a fail-open client, as the attack ran.
func TestInvalidUTF8KeyIsRefused(t *testing.T) {
	clock := window.NewManualClock(t0)
	nodes := testcluster.Start(t, 1, testcluster.Options{Clock: clock})
	c, err := client.New(client.Config{Addrs: testcluster.Addrs(nodes), Timeout: 5 * time.Second, Logger: testcluster.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mk := func(name string, key middleware.KeyFunc) http.Handler {
		m, err := middleware.New(middleware.Config{Checker: c, Name: name, Limit: fixed(1, time.Minute), Key: key, Now: clock.Now, Logger: testcluster.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		return m.Handler(ok)
	}
	user := mk("utf8-user", middleware.FirstOf(middleware.UserFromHeader("X-User-Id"), byIP(t, middleware.IPConfig{})))
	for i, want := range []int{200, 429, 429} {
		if got := serve(user, "GET", "/u/", "", "X-User-Id", "bob").Code; got != want {
			t.Fatalf("bob %d: %d, want %d", i+1, got, want)
		}
	}
	for i := range 3 {
		w := serve(user, "GET", "/u/", "", "X-User-Id", "bob\xff")
		if w.Code != 400 || w.Header().Get("X-RateLimit-Limit") != "" || w.Body.String() == "ok" {
			t.Fatalf("bob\\xff %d: %d %q, want 400", i+1, w.Code, w.Body.String())
		}
	}
	// Pattern outside a mux is the raw path: /p/%ff is no UTF-8.
	path := mk("utf8-path", middleware.Composite(byIP(t, middleware.IPConfig{}), middleware.Pattern()))
	for i, want := range []int{200, 429} {
		if got := serve(path, "GET", "/p/x", "").Code; got != want {
			t.Fatalf("/p/x %d: %d, want %d", i+1, got, want)
		}
	}
	for i := range 3 {
		if got := serve(path, "GET", "/p/%ff", "").Code; got != 400 {
			t.Fatalf("/p/%%ff %d: %d, want 400", i+1, got)
		}
	}

	// Whatever the KeyFunc, no invalid key reaches the Checker.
	rec := &recorder{}
	for _, key := range []middleware.KeyFunc{
		middleware.UserFromHeader("X-User-Id"),
		middleware.HeaderKey("X-User-Id", "h:"),
		middleware.Pattern(),
		middleware.Field("email"),
		middleware.Const("bad\xfe"),
		middleware.Composite(middleware.Const("a"), middleware.Field("email")),
		middleware.UserFromContext(func(context.Context) (string, bool) { return "\xc3", true }),
	} {
		m, err := middleware.New(middleware.Config{Checker: rec, Name: "rec", Key: key, Logger: testcluster.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		h := m.Handler(ok)
		if got := serve(h, "POST", "/x/%ff", "email=A%ff", "X-User-Id", "bob\xff", "Content-Type", "application/x-www-form-urlencoded").Code; got != 400 {
			t.Errorf("invalid UTF-8: %d, want 400", got)
		}
	}
	if keys := rec.sent(); len(keys) != 0 {
		t.Fatalf("keys sent: %q", keys)
	}
	if _, err := middleware.New(middleware.Config{Checker: rec, Name: "n\xff", Key: middleware.Const("k")}); err == nil || !strings.Contains(err.Error(), "Config.Name") {
		t.Errorf("a name that is not UTF-8: %v", err)
	}
}

// Over-long keys are never sent: a header too long for a key is 431, any
// other key over MaxKeyBytes 400; a missing key with no fallback is 400.
// None of them logs at info or above (a client could flood the log).
func TestClientErrorsAre4xxAndQuiet(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	rec := &recorder{}
	mk := func(key middleware.KeyFunc) http.Handler {
		m, err := middleware.New(middleware.Config{Checker: rec, Name: "long", Key: key, Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		return m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	}
	user := mk(middleware.UserFromHeader("X-User-Id"))
	long := strings.Repeat("a", 2000)
	for range 3 {
		if got := serve(user, "GET", "/", "", "X-User-Id", long).Code; got != 431 {
			t.Fatalf("2000-byte X-User-Id: %d, want 431", got)
		}
		if got := serve(user, "GET", "/", "").Code; got != 400 {
			t.Fatalf("no X-User-Id, no fallback: %d, want 400", got)
		}
	}
	// The longest id that fits is sent; one byte more is not.
	fits := strings.Repeat("b", middleware.MaxKeyBytes-len("user:"))
	if got := serve(user, "GET", "/", "", "X-User-Id", fits).Code; got != 200 {
		t.Fatalf("%d-byte key: %d, want 200", middleware.MaxKeyBytes, got)
	}
	if got := serve(user, "GET", "/", "", "X-User-Id", fits+"b").Code; got != 431 {
		t.Fatalf("%d-byte key: %d, want 431", middleware.MaxKeyBytes+1, got)
	}
	// A long key from the body.
	field := mk(middleware.Composite(middleware.Const("r"), middleware.Field("email")))
	if got := serve(field, "POST", "/", "email="+long, "Content-Type", "application/x-www-form-urlencoded").Code; got != 400 {
		t.Fatalf("2000-byte field: %d, want 400", got)
	}
	if keys := rec.sent(); len(keys) != 1 || len(keys[0]) != middleware.MaxKeyBytes {
		t.Fatalf("keys sent: %d, want the one that fits", len(keys))
	}
	if logs.Len() != 0 {
		t.Fatalf("client errors logged at info or above:\n%s", logs.String())
	}
	// The cluster's errors are still errors, logged.
	m, _ := middleware.New(middleware.Config{Checker: fakeChecker{err: client.ErrUnavailable}, Name: "x", Key: middleware.Const("k"), Logger: logger})
	if got := serve(m.Handler(http.NotFoundHandler()), "GET", "/", "").Code; got != 503 || !strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("unavailable: %d, log %q", got, logs.String())
	}
}

// Field never keys by a value of the client's choosing while the app
// reads another: a field given twice (in any case variant in JSON, as
// encoding/json matches names) is ErrBadRequest; a field it cannot see
// (body over the cap, JSON as text/plain) is ErrNoKey, so FirstOf falls
// back.
func TestFieldAmbiguousBodies(t *testing.T) {
	field := func(name, ctype, body string) (string, error) {
		r := httptest.NewRequest("POST", "/login", strings.NewReader(body))
		if ctype != "" {
			r.Header.Set("Content-Type", ctype)
		}
		k, err := middleware.Field(name)(r)
		if got, _ := io.ReadAll(r.Body); string(got) != body {
			t.Errorf("%s body after Field: %d bytes, want %d", ctype, len(got), len(body))
		}
		return k, err
	}
	const js, form = "application/json", "application/x-www-form-urlencoded"
	for _, tc := range []struct {
		name, ctype, body string
		key               string
		err               error
	}{
		{"email", js, `{"email":" Random123@X.com ","n":1}`, "random123@x.com", nil},
		{"email", js, `{"EMAIL":"Victim@x.com"}`, "victim@x.com", nil}, // the app reads it too
		{"email", js, `{"email":"random123@x.com","EMAIL":"victim@x.com"}`, "", middleware.ErrBadRequest},
		{"email", js, `{"email":"a@x.com","email":"victim@x.com"}`, "", middleware.ErrBadRequest},
		{"key", js, `{"key":"a","\u212aey":"victim"}`, "", middleware.ErrBadRequest}, // Kelvin sign: encoding/json folds it to k
		{"email", js, `{"email":{"$ne":null}}`, "", middleware.ErrBadRequest},
		{"email", js, `{"email":"a@x.com"} {"email":"victim@x.com"}`, "", middleware.ErrBadRequest},
		{"id", js, `{"id":12345}`, "12345", nil},
		{"email", js, `{"name":"x"}`, "", middleware.ErrNoKey},
		{"email", js, `{"email":"  "}`, "", middleware.ErrNoKey},
		{"email", js, `["email"]`, "", middleware.ErrNoKey},
		{"email", js, strings.Repeat(" ", middleware.MaxFieldBody) + `{"email":"victim@x.com"}`, "", middleware.ErrNoKey},
		{"email", "text/plain", `{"email":"victim@x.com"}`, "", middleware.ErrNoKey},
		{"email", "", `{"email":"victim@x.com"}`, "", middleware.ErrNoKey},
		{"email", form, "email=A%40x.com&x=1", "a@x.com", nil},
		{"email", form, "email=random1%40x.com&email=victim%40x.com", "", middleware.ErrBadRequest},
		{"email", form, "email=a;email=victim", "", middleware.ErrBadRequest},
		{"email", form, "Email=victim", "", middleware.ErrNoKey}, // forms are case-sensitive
		{"email", form, "", "", middleware.ErrNoKey},
	} {
		k, err := field(tc.name, tc.ctype, tc.body)
		if k != tc.key || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("Field(%q) of %s %.60q: %q, %v; want %q, %v", tc.name, tc.ctype, tc.body, k, err, tc.key, tc.err)
		}
	}
	// The app's view of the ambiguous JSON: encoding/json takes EMAIL.
	var app struct{ Email string }
	_ = json.Unmarshal([]byte(`{"email":"random123@x.com","EMAIL":"victim@x.com"}`), &app)
	if app.Email != "victim@x.com" {
		t.Fatalf("encoding/json decoded %q", app.Email)
	}

	// Through the Handler: ambiguous is 400; unseen falls back.
	rec := &recorder{}
	m, err := middleware.New(middleware.Config{Checker: rec, Name: "f", Logger: testcluster.Logger(),
		Key: middleware.FirstOf(middleware.Field("email"), middleware.Const("fallback"))})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	if got := serve(h, "POST", "/", `{"email":"r@x.com","Email":"victim@x.com"}`, "Content-Type", js).Code; got != 400 {
		t.Fatalf("ambiguous JSON: %d, want 400", got)
	}
	if got := serve(h, "POST", "/", `{"email":"victim@x.com"}`, "Content-Type", "text/plain").Code; got != 200 {
		t.Fatalf("JSON as text/plain: %d, want 200", got)
	}
	if got := serve(h, "POST", "/", "email=v%40x.com", "Content-Type", form).Code; got != 200 {
		t.Fatalf("form: %d, want 200", got)
	}
	if keys := rec.sent(); len(keys) != 2 || keys[0] != "fallback" || keys[1] != "v@x.com" || !utf8.ValidString(keys[1]) {
		t.Fatalf("keys sent: %q", keys)
	}
}

// The gRPC interceptors never send a bad key either: a user id that is
// not valid UTF-8 or too long, or no key, is INVALID_ARGUMENT.
func TestGRPCBadKeys(t *testing.T) {
	rec := &recorder{}
	unary, err := middleware.UnaryServerInterceptor(middleware.GRPCConfig{Checker: rec, Name: "g",
		Key: middleware.MetadataUser("x-user-id"), Logger: testcluster.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	call := func(md metadata.MD) codes.Code {
		ctx := metadata.NewIncomingContext(context.Background(), md)
		_, err := unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/x.Y/Z"}, func(context.Context, any) (any, error) { return "ok", nil })
		return status.Code(err)
	}
	for name, md := range map[string]metadata.MD{
		"not UTF-8": metadata.Pairs("x-user-id", "bob\xff"),
		"too long":  metadata.Pairs("x-user-id", strings.Repeat("a", 2000)),
		"no id":     metadata.MD{},
	} {
		if got := call(md); got != codes.InvalidArgument {
			t.Errorf("%s: %s, want InvalidArgument", name, got)
		}
	}
	if got := call(metadata.Pairs("x-user-id", "bob")); got != codes.OK {
		t.Fatalf("bob: %s", got)
	}
	if keys := rec.sent(); len(keys) != 1 || keys[0] != "user:bob" {
		t.Fatalf("keys sent: %q", keys)
	}
}
