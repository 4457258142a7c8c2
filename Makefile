# auditd: make run (service with a demo), make test (all tests), make bench.
GO      ?= go
BIN     := bin/auditd
DATA    ?= ./data
ADDR    ?= 127.0.0.1:8080
BENCH   ?= .
COUNT   ?= 6
BENCHTIME ?= 1s
# The version runs and evidence record and auditd version prints.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)

.PHONY: build run test bench bench-pacing lint fuzz clean

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/auditd

# The service on its embedded bbolt default, with the simulator's hostile
# upstreams and two demo runs to look at.
run: build
	$(BIN) serve --data $(DATA) --addr $(ADDR) --demo testdata/scenarios/demo.yaml

test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 8m ./...

# Benchmarks, side by side in one run; compare with benchstat. The proxy
# route's: make bench BENCH=ProxyLatency BENCHTIME=2000x, and
# BENCH=ProxyThroughput BENCHTIME=20000x (docs/bench/proxy.md).
bench:
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchtime=$(BENCHTIME) -benchmem -count=$(COUNT) -timeout 60m ./... | tee bench.txt
	$(GO) tool benchstat bench.txt

# Learning against real nginx limit_req servers auditd is not told, side by
# side with a client told the limit and one that only retries (needs nginx;
# about 11 minutes: the 60-a-minute shape at 600 items).
PACING_N ?= 200,600
bench-pacing: build
	$(GO) run ./scripts/bench-pacing -auditd $(BIN) -n $(PACING_N)

# staticcheck is pinned in go.mod's tool block.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

# A short pass of every fuzz target (parsers of outside input), after the
# contract fuzzer: CONTRACT_CHECKS requests generated from api/openapi.yaml
# (TestContractFuzz; go test sends 100).
FUZZTIME ?= 15s
CONTRACT_CHECKS ?= 5000
fuzz:
	$(GO) test ./api/ -count=1 -run '^TestContractFuzz$$' -v -rapid.checks=$(CONTRACT_CHECKS) -rapid.nofailfile
	@for pkg in $$(go list ./...); do \
	  for f in $$(go test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "$$pkg $$f"; $(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

clean:
	rm -rf bin bench.txt
