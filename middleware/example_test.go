package middleware_test

import (
	"log"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/middleware"
)

// Limit every route of a mux: signed-in users (X-User-Id from the
// gateway) by id, everyone else by an HMAC of their IP; sign-in also by
// route, IP and e-mail together, 5 per 15 minutes, inline.
func Example() {
	c, err := client.New(client.Config{Addrs: []string{"127.0.0.1:7070", "127.0.0.1:7071"}, Timeout: 500 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	byIP, err := middleware.ClientIP(middleware.IPConfig{Secret: []byte("at least sixteen bytes of secret")})
	if err != nil {
		log.Fatal(err)
	}
	api, err := middleware.New(middleware.Config{Checker: c, Name: "api", Window: time.Minute,
		Key: middleware.FirstOf(middleware.UserFromHeader("X-User-Id"), byIP)})
	if err != nil {
		log.Fatal(err)
	}
	signin, err := middleware.New(middleware.Config{Checker: c, Name: "auth.signin",
		Limit: &client.Limit{Limit: 5, Window: 15 * time.Minute, Algorithm: client.SlidingWindow},
		Key:   middleware.Composite(middleware.Pattern(), byIP, middleware.Field("email"))})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /signin", signin.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	_ = &http.Server{Addr: ":8080", Handler: api.Handler(mux)}
}
