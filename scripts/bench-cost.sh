#!/usr/bin/env bash
# `make bench-cost` (and a section of `make bench`): riser's instructions per I/O, counted by
# valgrind's callgrind over a bounded in-process run (perf/examples/cost.rs): the real server
# on one adaptive reactor over the in-memory datamover, a null LUN, one riser-initiator
# session at QD 32 (COST_QD): 4 KiB random read and write (COST_IOS, default 4000 each),
# 128 KiB sequential read and write (COST_IOS_LARGE, default 400 each). Instruction counts
# do not move with the machine's load: a change's cost per I/O can be judged on a busy
# machine: compare the "less idle" column (the target's instructions without its reactor's
# idle passes, whose number depends on timing), which repeats within about 0.5 % between runs,
# with a build or `yes` on the other core. valgrind counts each byte of a `rep stosb`/`rep movsb`
# (glibc's large memset/memcpy) as an instruction: the null LUN's zero-filled reads weigh their
# size. About a minute. COST_OUT=DIR keeps callgrind's files (callgrind_annotate them).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "bench-cost.sh: valgrind is missing (scripts/setup.sh bench-cost installs it)" >&2; exit 1; }
cargo build --release -q -p riser-perf --example cost
exe=${CARGO_TARGET_DIR:-target}/release/examples/cost
args=(--ios "${COST_IOS:-4000}" --ios-large "${COST_IOS_LARGE:-400}" --qd "${COST_QD:-32}")
[ -z "${COST_OUT:-}" ] || args+=(--out "$COST_OUT")
"$exe" "${args[@]}"
