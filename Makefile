# sluice: make help lists the targets.
GO       ?= go
BIN      ?= bin/sluice
PROTOC   ?= protoc
MODULE   := github.com/sluicehq/sluice

.DEFAULT_GOAL := test

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: build
build: ## build bin/sluice (static, CGO_ENABLED=0)
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/sluice

.PHONY: run
run: build ## start a local three-node cluster on loopback (Ctrl-C stops all three)
	./scripts/run-local.sh $(BIN)

.PHONY: test
test: ## vet, then run every test with the race detector
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

.PHONY: bench
bench: ## window benchmarks against go-limiter (see BENCHMARKS.md)
	$(GO) test ./window -run '^$$' -bench . -benchmem -count 5

.PHONY: bench-cluster
bench-cluster: build ## start 3 nodes on loopback, run the four sluice bench workloads, write BENCHMARKS.md
	./scripts/bench-cluster.sh $(BIN)

.PHONY: smoke
smoke: build ## start a node and query it with grpcurl, a client we did not write
	./scripts/smoke.sh $(BIN)

.PHONY: fmt-check
fmt-check: ## fail if gofmt would change a file
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

.PHONY: tidy-check
tidy-check: ## fail if go mod tidy would change go.mod or go.sum
	$(GO) mod tidy
	git diff --exit-code go.mod go.sum

.PHONY: proto
proto: ## regenerate rpc/sluicev1 from proto/ (needs protoc, protoc-gen-go, protoc-gen-go-grpc)
	$(PROTOC) -I proto \
		--go_out=. --go_opt=module=$(MODULE) \
		--go-grpc_out=. --go-grpc_opt=module=$(MODULE) \
		proto/sluice/v1/sluice.proto

.PHONY: proto-tools
proto-tools: ## install the protoc plugins at the versions the committed code was made with
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2

.PHONY: verify-proto
verify-proto: proto ## fail if the committed generated code differs from a fresh make proto
	git diff --exit-code rpc/sluicev1

.PHONY: clean
clean: ## remove build output
	rm -rf bin
