# forge: `make run` runs the main job on the bundled tiny model,
# `make test` runs every check CI runs. Both work on a fresh machine with Go.

GO        ?= go
BIN       := bin/forge
MODEL     ?= gguf/testdata/stories260K-Q4_0.gguf
PROMPT    ?= Once upon a time
FUZZTIME  ?= 20s
# Packages whose tests and benchmarks need a GPU; `make device` cross-builds
# them into bin/device/ to carry to the GPU machine, where bench/device.sh
# runs every GPU test and benchmark in one call.
DEVICE_PKGS ?= rocm kernels/gpu actors pipeline pipeline/model

GOFILES = $(shell find . -name '*.go' -not -path './bin/*')

.PHONY: all build run test fmt-check vet unit fuzz device kernels clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/forge

run: build
	./$(BIN) run -m $(MODEL) -p "$(PROMPT)" -n 64

test: fmt-check vet unit fuzz

fmt-check:
	@out="$$(gofmt -l $(GOFILES))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# The second line runs the plain-Go twins of the assembly fast paths.
unit:
	$(GO) test -race -timeout 30m ./...
	$(GO) test -tags purego -timeout 15m ./dequant/... ./kernels/cpu/...

# A short fuzz of the GGUF reader, the server's request decoder and the
# store-name parser on every run; run them longer by hand with
# `make fuzz FUZZTIME=10m SERVEFUZZTIME=10m`.
SERVEFUZZTIME ?= 10s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzOpen$$' -fuzztime $(FUZZTIME) ./gguf
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRequest$$' -fuzztime $(SERVEFUZZTIME) ./cmd/forge
	$(GO) test -run '^$$' -fuzz '^FuzzStoreName$$' -fuzztime $(SERVEFUZZTIME) ./pipeline/store

device:
	@mkdir -p bin/device
	for p in $(DEVICE_PKGS); do \
		CGO_ENABLED=0 $(GO) test -c -trimpath -ldflags='-s -w' -o bin/device/$$(basename $$p).test ./$$p || exit 1; \
	done
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o bin/device/forge ./cmd/forge
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o bin/device/kernels-gen ./kernels/gpu/gen

# Regenerate the compiled kernels shipped in the binary (kernels/gpu/obj)
# after a kernel source change; bench/kernels-gen.sh says how.
kernels:
	bench/kernels-gen.sh

clean:
	rm -rf bin
