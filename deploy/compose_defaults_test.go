package deploy

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

// make cluster-up's network and ports have one default each, written in
// three places: the Makefile's variables, docker-compose.yml's
// ${SLUICE_COMPOSE_*:-default} (what a bare docker-compose up uses) and
// docs/install.md's table. They must agree, and stay clear of make run's
// ports (7070-7082).
func TestClusterUpDefaultsAgree(t *testing.T) {
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	makefile, compose, doc := read("../Makefile"), read("../docker-compose.yml"), read("../docs/install.md")
	for _, v := range []struct{ make, compose string }{
		{"CLUSTER_NET", "SLUICE_COMPOSE_NET"},
		{"CLUSTER_GRPC_PORT", "SLUICE_COMPOSE_GRPC_PORT"},
		{"CLUSTER_HTTP_PORT", "SLUICE_COMPOSE_HTTP_PORT"},
	} {
		m := regexp.MustCompile(`(?m)^` + v.make + `\s*\?=\s*(\S+)$`).FindStringSubmatch(makefile)
		if m == nil {
			t.Fatalf("the Makefile sets no %s ?= default", v.make)
		}
		def := m[1]
		uses := regexp.MustCompile(`\$\{`+v.compose+`:-([^}]*)\}`).FindAllStringSubmatch(compose, -1)
		if len(uses) == 0 {
			t.Errorf("docker-compose.yml does not use ${%s:-...}", v.compose)
		}
		for _, u := range uses {
			if u[1] != def {
				t.Errorf("docker-compose.yml: ${%s:-%s}, the Makefile's %s is %s", v.compose, u[1], v.make, def)
			}
		}
		if !regexp.MustCompile("(?m)^\\| `" + v.make + "` \\| `" + regexp.QuoteMeta(def) + "` \\|").MatchString(doc) {
			t.Errorf("docs/install.md's table does not give %s its default %s", v.make, def)
		}
		if port, err := strconv.Atoi(def); v.make != "CLUSTER_NET" && (err != nil || port >= 7070 && port <= 7082) {
			t.Errorf("%s defaults to %s, one of make run's ports", v.make, def)
		}
	}
}
