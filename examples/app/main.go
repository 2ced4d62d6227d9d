// Command app is a small web app limited by a sluice cluster through
// package middleware: every route by user (X-User-Id, as set by an
// authenticating gateway) or else by client IP under the "api" limit,
// and sign-up by route + IP + e-mail under "auth.signup". Start a cluster
// with `make run` (it loads examples/limits.yaml), then:
//
//	IP_KEY_SECRET=$(head -c 32 /dev/urandom | base64) go run ./examples/app
//	curl -i 127.0.0.1:8081/hello
//
// Settings come from the environment: SLUICE_CLUSTER (gRPC addresses,
// default the three of make run), APP_ADDR (default 127.0.0.1:8081),
// IP_KEY_SECRET (required, at least 16 bytes: the HMAC key of client IPs).
package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/middleware"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "app:", err)
		os.Exit(1)
	}
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run() error {
	c, err := client.New(client.Config{
		Addrs:   strings.Split(getenv("SLUICE_CLUSTER", "127.0.0.1:7070,127.0.0.1:7071,127.0.0.1:7072"), ","),
		Timeout: 500 * time.Millisecond, // fail open after that
	})
	if err != nil {
		return err
	}
	defer c.Close()
	byIP, err := middleware.ClientIP(middleware.IPConfig{Secret: []byte(os.Getenv("IP_KEY_SECRET"))})
	if err != nil {
		return err
	}
	api, err := middleware.New(middleware.Config{
		Checker: c, Name: "api", Window: time.Minute, // the window of "api" in examples/limits.yaml
		Key: middleware.FirstOf(middleware.UserFromHeader("X-User-Id"), byIP),
	})
	if err != nil {
		return err
	}
	signup, err := middleware.New(middleware.Config{
		Checker: c, Name: "auth.signup", Window: time.Hour,
		Key: middleware.Composite(middleware.Pattern(), byIP, middleware.Field("email")),
	})
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		d, _ := middleware.DecisionFrom(r.Context())
		fmt.Fprintf(w, "hello; %d calls left (degraded: %v)\n", d.Remaining, d.Degraded)
	})
	mux.Handle("POST /auth/signup", signup.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "signed up")
	})))
	addr := getenv("APP_ADDR", "127.0.0.1:8081")
	slog.Info("app listening", "addr", addr)
	srv := &http.Server{Addr: addr, Handler: api.Handler(mux), ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}
