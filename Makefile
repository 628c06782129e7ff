# riser: the two commands that matter are `make run` and `make test` (see README.md).
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: all build release run test unit integration bench bench-cost bench-profile bench-rbd bench-rxe bench-scale fuzz deps clean install uninstall

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

# Every test: clippy, unit tests of each crate and the integration tests that drive the real binaries.
test:
	@scripts/setup.sh build test
	$(CARGO) build --workspace
	# Lints are part of the test: every target (tests, benches, examples) warning-free.
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# The hostile-peers test judges the daemon users run: the release build.
	$(CARGO) build --release -p riser --bin riser
	$(CARGO) test --workspace --no-fail-fast

# Benchmarks print figures; they are not tests. About 20 minutes (plus SPDK v24.01's build,
# about 10 minutes, once, cached in /opt/spdk-peer/spdk): bdevperf-like runs; riser vs SPDK's
# iscsi_tgt and tgt, each alone on core 0, with iscsi-perf and riser-perf (IOPS, busy time per
# I/O, ratios; table and JSON under target/bench/peers-DATE/); the riser-perf matrix vs tgt.
# BENCH_TIME=seconds BENCH_ROUNDS=n shorten or lengthen every part; BENCH_PEERS=spdk,spdk-uring,tgt
# picks peers (SPDK with its posix and its io_uring sockets; ratios against the better one).
bench: release
	@scripts/setup.sh bench
	scripts/bench.sh

# Only the cost section of `make bench`: riser's instructions per I/O under valgrind's callgrind
# (in process, in-memory datamover, null LUN; about a minute), figures the machine's load does
# not move. COST_IOS, COST_IOS_LARGE, COST_QD, COST_OUT (keeps callgrind's files).
bench-cost: deps
	@scripts/setup.sh bench-cost
	scripts/bench-cost.sh

# Where the cycles go (issue 25): riser and SPDK's iscsi_tgt, each alone on core 0 under the
# same riser-perf load (2 sessions x QD 64, 4 KiB random read): syscalls, receives and sends
# per I/O, bytes per receive and per send, PDUs per send, reactor passes per I/O, busy time
# (a table; files under target/bench/profile-DATE/). PROFILE_TIME, PROFILE_WINDOW, PROFILE_QD.
bench-profile: release
	@scripts/setup.sh bench
	scripts/bench-profile.sh

# Ceph RBD behind riser (one and two gateways) vs librbd's own rbd bench and tgt's rbd backing
# store, 4 KiB random read/write QD 32 on the single-node test cluster (table and runs under
# target/bench/rbd-DATE/; about 5 minutes). BENCH_TIME, BENCH_ROUNDS, BENCH_QD, BENCH_RBD_MIB.
bench-rbd: release
	@scripts/setup.sh bench-rbd
	scripts/bench-rbd.sh

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

# Installs what `make release` built (it builds nothing: run `make release` first) into
# $(DESTDIR)$(PREFIX): the binaries riser, riser-rpc, riser-perf, riser-top in $(BINDIR), the
# systemd unit riser.service in $(UNITDIR), and the sample config as $(SYSCONFDIR)/riser/riser.json
# when there is none (mode 0600: save_config writes CHAP secrets there), else as
# riser.json.sample next to the one in place, which is never overwritten. INSTALL_FROM picks
# another build (target/debug).
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR ?= $(PREFIX)/lib/systemd/system
INSTALL_FROM ?= $(or $(CARGO_TARGET_DIR),target)/release
INSTALL_BINS := riser riser-rpc riser-perf riser-top

install:
	@missing=; for b in $(INSTALL_BINS); do [ -f "$(INSTALL_FROM)/$$b" ] && [ -x "$(INSTALL_FROM)/$$b" ] || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make install: not built in $(INSTALL_FROM):$$missing (run 'make release' first)" >&2; exit 1; fi
	install -d -m 0755 "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(UNITDIR)" "$(DESTDIR)$(SYSCONFDIR)/riser"
	install -m 0755 $(addprefix $(INSTALL_FROM)/,$(INSTALL_BINS)) "$(DESTDIR)$(BINDIR)/"
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' scripts/systemd/riser.service.in > "$(DESTDIR)$(UNITDIR)/.riser.service.tmp"
	mv -f "$(DESTDIR)$(UNITDIR)/.riser.service.tmp" "$(DESTDIR)$(UNITDIR)/riser.service"
	chmod 0644 "$(DESTDIR)$(UNITDIR)/riser.service"
	@if [ -e "$(DESTDIR)$(SYSCONFDIR)/riser/riser.json" ]; then \
	  install -m 0644 scripts/riser.sample.json "$(DESTDIR)$(SYSCONFDIR)/riser/riser.json.sample"; \
	  echo "make install: kept $(SYSCONFDIR)/riser/riser.json; the sample is $(SYSCONFDIR)/riser/riser.json.sample"; \
	else \
	  install -m 0600 scripts/riser.sample.json "$(DESTDIR)$(SYSCONFDIR)/riser/riser.json"; \
	  echo "make install: sample config installed as $(SYSCONFDIR)/riser/riser.json"; \
	fi
	@[ -n "$(DESTDIR)" ] || echo "make install: then 'systemctl daemon-reload && systemctl enable --now riser'"

# Removes the binaries and the unit; $(SYSCONFDIR)/riser (the config) and /var/lib/riser stay.
uninstall:
	rm -f $(addprefix "$(DESTDIR)$(BINDIR)/,$(addsuffix ",$(INSTALL_BINS))) "$(DESTDIR)$(UNITDIR)/riser.service"
