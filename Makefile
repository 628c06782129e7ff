# riser: the two commands that matter are `make run` and `make test` (see README.md).
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: all build release run test unit integration bench bench-rxe bench-scale fuzz deps clean

all: build

deps:
	@scripts/setup.sh build

build: deps
	$(CARGO) build --workspace

release: deps
	$(CARGO) build --release --workspace

# Runs riser with the built-in default config (a 64 MiB malloc bdev) and the RPC socket
# /var/tmp/riser.sock. Ctrl-C stops it.
run: release
	./target/release/riser --default-config $(RISER_ARGS)

# Every test: unit tests of each crate and the integration tests that drive the real binaries.
test:
	@scripts/setup.sh build test
	$(CARGO) build --workspace
	$(CARGO) test --workspace --no-fail-fast

# Benchmarks print figures; they are not tests. About 10 minutes (plus SPDK v24.01's build,
# about 10 minutes, once, cached in /opt/spdk-peer/spdk): bdevperf-like runs; riser vs SPDK's
# iscsi_tgt and tgt, each alone on core 0, with iscsi-perf and riser-perf (IOPS, busy time per
# I/O, ratios; table and JSON under target/bench/peers-DATE/); the riser-perf matrix vs tgt.
# BENCH_TIME=seconds BENCH_ROUNDS=n shorten or lengthen every part; BENCH_PEERS=spdk,tgt picks peers.
bench: release
	@scripts/setup.sh bench
	scripts/bench.sh

# iSER in the soft-RoCE VM, riser against LIO/isert: Linux ib_iser + fio, then the riser-perf
# matrix over iser:// (table, JSON and chart under target/bench/matrix-rxe-DATE/).
bench-rxe: build
	@scripts/setup.sh bench
	scripts/bench-rxe.sh
	scripts/bench-matrix-rxe.sh

# Multi-reactor scaling over iSCSI/TCP on loopback (needs about 16 cores; see the script).
bench-scale: release
	scripts/bench-scale.sh

# Fuzzing, never part of `make test`: each cargo-fuzz target of test/fuzz/ (framer, pdu_codec,
# text, login, iser_header, scsi_cdb, session) for FUZZ_SECONDS (default 60) with libFuzzer and ASan, on
# the stable toolchain; installs cargo-fuzz if missing. FUZZ_TARGETS picks some, FUZZ_SANITIZER=
# none runs without ASan. Seeds in test/fuzz/corpus/, findings in test/fuzz/artifacts/.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh $(FUZZ_TARGETS)

clean:
	$(CARGO) clean
