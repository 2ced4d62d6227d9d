# sluice: make help lists the targets.
GO       ?= go
BIN      ?= bin/sluice
PROTOC   ?= protoc
MODULE   := github.com/sluicehq/sluice

.DEFAULT_GOAL := test

# What make build and make docker stamp into the binary (sluice --version,
# the members' metadata, sluice_build_info): git describe of the checkout
# (the last tag, the commits since and the commit, -dirty with uncommitted
# changes; the commit alone before the first tag) and the commit. Outside
# a git checkout both are empty and the binary reports what the Go
# toolchain recorded (docs/install.md).
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS  = -X main.version=$(VERSION) -X main.revision=$(REVISION)

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: build
build: ## build bin/sluice (static, CGO_ENABLED=0), its version stamped from git describe
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/sluice

.PHONY: run
run: build ## start a local three-node cluster on loopback (Ctrl-C stops all three)
	./scripts/run-local.sh $(BIN)

.PHONY: test
# The join, leave, crash and restart tests again, with regions configured
# (SLUICE_TEST_REGIONS, see rpc/helpers_test.go): inside a region the
# exactness holds as in a single-region cluster.
REGION_TESTS ?= JoinAndLeave|RollingReplacement|ReplacingAnOwner|JoinDuringHits|KilledOwner|Restart|StandIn|FinishLeave|CheckDecidedAsTheRingChanges|DuplicateName|Pin|Region|CrashedNodeSnapshot|LeaveHandsOffOrSavesLast

test: ## vet, then run every test with the race detector (and rpc's join/leave/crash tests again with regions configured, and the lab's lease scenarios alone)
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 30m ./...
	SLUICE_TEST_REGIONS=local=1000000,far=1 $(GO) test -race -count=1 -run '$(REGION_TESTS)' ./rpc
	SLUICE_LAB_LEASES=1 $(GO) test -race -count=1 -run 'TestLease|TestRollingDeploy' ./scenario/lab
	SLUICE_PAUSE=1 SLUICE_PAUSE_REPS=$(PAUSE_REPS) $(GO) test -count=1 -run TestPausedOwner -timeout 30m ./scenario/pause

# Repetitions of each kind of pause (longer and shorter than failure
# detection) of the real binary in make test; issue 36 asks for 50
# (make test-pause PAUSE_REPS=50: about 20 minutes).
PAUSE_REPS ?= 5

.PHONY: test-pause
test-pause: ## SIGSTOP a real node's owner of keys mid-load and resume it, PAUSE_REPS times each way (scenario/pause)
	SLUICE_PAUSE=1 SLUICE_PAUSE_REPS=$(PAUSE_REPS) $(GO) test -count=1 -v -run TestPausedOwner -timeout 60m ./scenario/pause 2>&1 | grep -E 'SUMMARY|over|FAIL|^ok'

.PHONY: bench
bench: ## window benchmarks against go-limiter (see BENCHMARKS.md)
	$(GO) test ./window -run '^$$' -bench . -benchmem -count 5

.PHONY: docker
IMAGE ?= sluice:dev
docker: ## build bin/sluice-static (CGO_ENABLED=0) and the FROM scratch image (IMAGE, default sluice:dev), its version stamped from git describe
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/sluice-static ./cmd/sluice
	docker build --label org.opencontainers.image.version=$(VERSION) --label org.opencontainers.image.revision=$(REVISION) -t $(IMAGE) .

# The client flags for the cluster of make cluster-up.
CLUSTER_TLS = --tls-ca .cluster/ca/ca.pem --tls-cert .cluster/client/dev.pem --tls-key .cluster/client/dev-key.pem
# Where make cluster-up puts its containers: the docker network
# CLUSTER_NET.0/24 (the nodes at .11, .12 and .13), and sluice1's gRPC and
# HTTP published on 127.0.0.1:CLUSTER_GRPC_PORT and :CLUSTER_HTTP_PORT.
# The defaults stay clear of make run (7070-7072, 7080-7082, 7946-7948),
# the README's regions (7170-7182), make bench-cluster (7270-7372) and
# the e2e suite's network (172.28.97); give another checkout's cluster
# other values (docs/install.md), and a directory name of its own or
# COMPOSE_PROJECT_NAME (docker-compose names the containers after it).
CLUSTER_NET       ?= 172.28.7
CLUSTER_GRPC_PORT ?= 7470
CLUSTER_HTTP_PORT ?= 7480
CLUSTER_ENV = SLUICE_IMAGE=$(IMAGE) SLUICE_COMPOSE_NET=$(CLUSTER_NET) SLUICE_COMPOSE_GRPC_PORT=$(CLUSTER_GRPC_PORT) SLUICE_COMPOSE_HTTP_PORT=$(CLUSTER_HTTP_PORT)

.PHONY: cluster-up
cluster-up: build docker ## start three nodes in containers (docker-compose.yml); sluice1's gRPC and HTTP on 127.0.0.1:CLUSTER_GRPC_PORT and :CLUSTER_HTTP_PORT (7470, 7480), network CLUSTER_NET.0/24 (172.28.7)
	@# A gossip key, a development CA, a peer certificate per node and a
	@# client certificate, made with sluice's own commands and kept out of
	@# git; readable by the containers' user (development only). The peer
	@# certificates name the nodes' addresses: made again when CLUSTER_NET
	@# changes.
	mkdir -p .cluster
	[ -s .cluster/gossip.keys ] || bin/sluice keygen > .cluster/gossip.keys
	[ -s .cluster/ca/ca.pem ] || bin/sluice tls ca create --out .cluster/ca
	[ "$$(cat .cluster/net 2>/dev/null)" = "$(CLUSTER_NET)" ] || rm -rf .cluster/sluice1 .cluster/sluice2 .cluster/sluice3
	echo "$(CLUSTER_NET)" > .cluster/net
	for i in 1 2 3; do \
	  [ -s .cluster/sluice$$i/sluice$$i.pem ] || bin/sluice tls cert create --ca .cluster/ca --peer sluice$$i \
	    --host sluice$$i --host $(CLUSTER_NET).1$$i --host 127.0.0.1 --out .cluster/sluice$$i || exit 1; \
	done
	[ -s .cluster/client/dev.pem ] || bin/sluice tls cert create --ca .cluster/ca --client dev --out .cluster/client
	chmod -R a+rX .cluster
	$(CLUSTER_ENV) docker-compose up -d
	@for i in $$(seq 1 60); do bin/sluice members --addr 127.0.0.1:$(CLUSTER_GRPC_PORT) $(CLUSTER_TLS) --json 2>/dev/null | grep -o '"state":"alive"' | wc -l | grep -qx 3 && break; sleep 1; done
	bin/sluice members --addr 127.0.0.1:$(CLUSTER_GRPC_PORT) $(CLUSTER_TLS)

.PHONY: cluster-down
cluster-down: ## stop the containers of make cluster-up
	$(CLUSTER_ENV) docker-compose down

.PHONY: regions-up
# REGIONS_WAN: a round trip in ms to put between the regions once they are up (tc
# netem from the host: needs root; see deploy/compose/regions/regions.sh).
REGIONS_WAN ?=
regions-up: build docker ## start three regions in containers, a node each (deploy/compose/regions: us-east, eu-west, ap-south on 127.0.0.1:7670-7672, plaintext), REGIONS_WAN=100 adds a 100 ms round trip between them (root); stop with deploy/compose/regions/regions.sh down
	SLUICE_IMAGE=$(IMAGE) SLUICE_BIN=$(BIN) ./deploy/compose/regions/regions.sh up
	$(if $(REGIONS_WAN),./deploy/compose/regions/regions.sh wan on $(REGIONS_WAN))

.PHONY: e2e
E2E_IMAGE ?= sluice:e2e
e2e: ## build bin/sluice and the image E2E_IMAGE (default sluice:e2e), then run the fault suite and the region tests in containers (e2e/, about 6 min)
	$(MAKE) build
	$(MAKE) docker IMAGE=$(E2E_IMAGE)
	cd e2e && SLUICE_E2E_IMAGE=$(E2E_IMAGE) $(GO) test -tags e2e -count=1 -v -timeout 30m .

.PHONY: fuzz
# FUZZTIME is a duration (10s) or a count of executions (5000x). CI gives a
# count: a duration races Go's fuzz coordinator at its deadline on a busy
# machine and fails with a bare "context deadline exceeded" and no input
# (golang/go#75804); a count has no deadline to race.
FUZZTIME ?= 10s
fuzz: ## run every fuzz target for FUZZTIME each (a duration, 10s by default, or a count such as 5000x; CI runs 3000x)
	@set -e; for t in $$(grep -rlE '^func Fuzz' --include='*_test.go' .); do \
	  pkg=$$(dirname $$t); \
	  for f in $$(grep -oE '^func Fuzz[A-Za-z0-9_]+' $$t | cut -d' ' -f2); do \
	    echo "fuzz $$pkg $$f ($(FUZZTIME))"; \
	    $(GO) test $$pkg -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) >/tmp/sluice-fuzz.log 2>&1 || { cat /tmp/sluice-fuzz.log; exit 1; }; \
	  done; \
	done

.PHONY: bench-leases
SEEDS ?= 2
bench-leases: ## issue 20's figures: every lease scenario on in-process clusters of 3 and 5 regions, 50 and 200 ms apart, SEEDS random seeds each, then buckets and sliding windows on 3 regions 100 ms apart, started past the allocators' learning horizon (about 27 min a seed)
	SLUICE_LEASE_MATRIX=1 SLUICE_LEASE_SEEDS=$(SEEDS) $(GO) test ./scenario/lab -run TestLeaseMatrix -count=1 -v -timeout 90m 2>&1 | tee bench-leases.log | grep -E '^\s+(3|5)  |row: |over-admission [1-9]|FAIL|ok'
	@# Issue 35's deploy rows: every node of a running cluster restarted in
	@# turn under load (3 and 5 regions, every algorithm that leases, 1 s,
	@# 1 min and 1 h windows, graceful and kill, two nodes per region, the
	@# allocator's node, a restart during a cut; about 25 minutes).
	SLUICE_LAB_LEASES=1 SLUICE_DEPLOY_FULL=1 $(GO) test ./scenario/lab -run TestRollingDeployNeverOverAdmits -count=1 -v -timeout 60m 2>&1 | tee bench-deploy.log | grep -E ' over +[0-9]+ \(max|FAIL|^ok'

.PHONY: bench-regions
bench-regions: build ## issue 19's figures: scenarios on in-process clusters of 3 regions 100 ms apart (about 6 min)
	./scripts/bench-regions.sh $(BIN)

.PHONY: bench-cluster
bench-cluster: build ## start 3 nodes on loopback, run the four sluice bench workloads, write BENCHMARKS.md
	./scripts/bench-cluster.sh $(BIN)

.PHONY: bench-threeway
# bench/threeway (its own Go module, built against this checkout): the gRPC
# echo with sluice's runtime settings, gubernator and sluice (any node and
# ring-aware), one load generator, interleaved rounds. Its knobs (ROUNDS,
# DUR, SYSTEMS, SLUICE_BASE_BIN, ...: bench/threeway/README.md) pass
# through from the command line or the environment.
bench-threeway: ## issue 23's figures: echo with sluice's settings vs gubernator vs sluice (any node, owner), 3 interleaved rounds on loopback, writes bench/threeway/results.md (about 20 min once the machine is quiet, 25 with SLUICE_BASE_BIN; needs the Go proxy for gubernator's toolchain and modules)
	SLUICE_SRC=$(CURDIR) ./bench/threeway/run.sh

.PHONY: bench-threeway-smoke
bench-threeway-smoke: ## bench-threeway in one short round of every default system (about 4 min): checks that the harness runs, not a measurement
	ROUNDS=1 DUR=3s WARMUP=1s GATE_WAIT=0s DIAG=0 SLUICE_BENCH=0 SLUICE_SRC=$(CURDIR) ./bench/threeway/run.sh

.PHONY: smoke
smoke: build ## start a node and query it with grpcurl, a client we did not write
	./scripts/smoke.sh $(BIN)

.PHONY: alerts-check
PROMTOOL ?= promtool
alerts-check: ## check deploy/prometheus (the rules, their unit tests, the scrape config) with promtool (Debian: apt-get install prometheus)
	$(PROMTOOL) check rules deploy/prometheus/alerts.yml
	$(PROMTOOL) test rules deploy/prometheus/alerts_test.yml
	$(PROMTOOL) check config deploy/prometheus/prometheus.yml

.PHONY: fmt-check
fmt-check: ## fail if gofmt would change a file
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

.PHONY: tidy-check
tidy-check: ## fail if go mod tidy would change go.mod or go.sum
	$(GO) mod tidy
	git diff --exit-code go.mod go.sum

.PHONY: proto
proto: ## regenerate rpc/sluicev1 and rpc/sluicev1gw from proto/ (needs protoc and the plugins of make proto-tools)
	$(PROTOC) -I proto \
		--go_out=. --go_opt=module=$(MODULE) \
		--go-grpc_out=. --go-grpc_opt=module=$(MODULE) \
		--go-vtproto_out=. --go-vtproto_opt=module=$(MODULE),features=marshal+unmarshal+size \
		proto/sluice/v1/sluice.proto proto/sluice/v1/admin.proto
	@# The HTTP/JSON gateway goes in a package of its own (standalone), so
	@# that clients importing the messages do not pull in grpc-gateway.
	rm -rf .proto-gw && mkdir -p .proto-gw rpc/sluicev1gw
	$(PROTOC) -I proto \
		--grpc-gateway_out=.proto-gw \
		--grpc-gateway_opt=paths=source_relative,standalone=true \
		--grpc-gateway_opt=grpc_api_configuration=proto/sluice/v1/sluice_http.yaml \
		proto/sluice/v1/sluice.proto proto/sluice/v1/admin.proto
	for f in sluice admin; do \
	  sed -e 's/^package sluicev1$$/package sluicev1gw/' -e 's/^Package sluicev1 is/Package sluicev1gw is/' \
		.proto-gw/sluice/v1/$$f.pb.gw.go > rpc/sluicev1gw/$$f.pb.gw.go || exit 1; \
	done
	rm -rf .proto-gw

proto-tools: ## install the protoc plugins at the versions the committed code was made with
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	$(GO) install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway@v2.33.0
	$(GO) install github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto@v0.6.1-0.20240319094008-0393e58bdf10

.PHONY: verify-proto
verify-proto: proto ## fail if the committed generated code differs from a fresh make proto
	git diff --exit-code rpc/sluicev1 rpc/sluicev1gw
	@test -z "$$(git status --porcelain rpc/sluicev1 rpc/sluicev1gw)" || { git status --porcelain rpc/sluicev1 rpc/sluicev1gw; echo 'generated files not committed'; exit 1; }

# Helm: the chart deploy/helm/sluice, and deploy/kubernetes rendered from it.
# HELM_VERSION is the helm deploy/kubernetes/sluice.yaml was rendered with.
HELM         ?= helm
HELM_VERSION ?= v4.3.2

.PHONY: helm-tools
helm-tools: ## install helm (HELM_VERSION) with go install, into $(go env GOPATH)/bin
	$(GO) install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)

.PHONY: k8s-manifests
k8s-manifests: ## render deploy/kubernetes/sluice.yaml from the Helm chart deploy/helm/sluice (needs helm: make helm-tools)
	HELM=$(HELM) ./deploy/render-manifests.sh > deploy/kubernetes/sluice.yaml.tmp || { rm -f deploy/kubernetes/sluice.yaml.tmp; exit 1; }
	mv deploy/kubernetes/sluice.yaml.tmp deploy/kubernetes/sluice.yaml

.PHONY: helm-check
helm-check: ## lint and render the Helm chart, then run the deploy tests with helm required (fails if deploy/kubernetes differs from make k8s-manifests)
	$(HELM) lint --strict deploy/helm/sluice --set image.repository=registry.invalid/sluice --set image.tag=dev
	$(HELM) template sluice deploy/helm/sluice --set image.repository=registry.invalid/sluice --set image.tag=dev >/dev/null
	SLUICE_HELM=$(HELM) SLUICE_HELM_REQUIRED=1 $(GO) test -race -count=1 ./deploy

.PHONY: clean
clean: ## remove build output
	rm -rf bin
