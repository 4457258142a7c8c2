# auditd: make run (service with a demo), make test (all tests), make bench.
GO      ?= go
BIN     := bin/auditd
DATA    ?= ./data
ADDR    ?= 127.0.0.1:8080
BENCH   ?= .
COUNT   ?= 6

.PHONY: build run test bench lint fuzz clean

build:
	$(GO) build -o $(BIN) ./cmd/auditd

run: build
	./scripts/run-demo.sh $(BIN) $(DATA) $(ADDR)

test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 8m ./...

# Benchmarks, side by side in one run; compare with benchstat.
bench:
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchmem -count=$(COUNT) -timeout 60m ./... | tee bench.txt
	$(GO) tool benchstat bench.txt

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Short fuzz pass over every parser of outside input.
fuzz:
	./scripts/fuzz.sh 20s

clean:
	rm -rf bin bench.txt
