#!/usr/bin/env bash
# Runs riser's fuzz targets (test/fuzz/, cargo-fuzz + libFuzzer) one after the other:
#   scripts/fuzz.sh [TARGET...]            (default: every target)
# FUZZ_SECONDS   seconds per target (default 60)
# FUZZ_SANITIZER address (default; ASan) or none (faster, catches panics only)
# FUZZ_JOBS      libFuzzer processes per target (default 1)
# FUZZ_ARGS      more libFuzzer flags, e.g. FUZZ_ARGS=-only_ascii=1
# Works on the stable toolchain: cargo-fuzz's nightly flags are allowed with RUSTC_BOOTSTRAP=1
# (set here, for the fuzz build only), and stable ships the ASan runtime. cargo-fuzz is
# installed if missing. Seeds: test/fuzz/corpus/<target>/ (committed, read only here; see
# scripts/fuzz-seeds.sh). The corpus libFuzzer grows: test/fuzz/work/<target>/. Crashes,
# timeouts (hangs, -timeout) and leaks: test/fuzz/artifacts/<target>/, replayed with
# `cd test/fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -s address TARGET artifacts/TARGET/FILE`.
# Prints executions and seconds per target; exits 1 if any target found something.
set -uo pipefail
cd "$(dirname "$0")/../test/fuzz"
export PATH=$HOME/.cargo/bin:$PATH
export RUSTC_BOOTSTRAP=1
seconds=${FUZZ_SECONDS:-60}
san=${FUZZ_SANITIZER:-address}
jobs=${FUZZ_JOBS:-1}
all=(framer pdu_codec text login iser_header scsi_cdb session)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz || exit 2
cargo fuzz build -s "$san" || exit 2

summary=()
found=0
for t in "${targets[@]}"; do
  mkdir -p "work/$t" "artifacts/$t"
  # Longer inputs where a stream of several PDUs matters.
  case $t in
    framer|login|session) max_len=16384 ;;
    scsi_cdb) max_len=8192 ;;
    *) max_len=4096 ;;
  esac
  dict=()
  case $t in text|login) dict=(-dict=dict/keys.dict) ;; esac
  par=()
  [ "$jobs" -gt 1 ] && par=(-jobs="$jobs" -workers="$jobs")
  log="artifacts/$t/last-run.log"
  before=$(find "artifacts/$t" -type f ! -name '*.log' | wc -l)
  echo "fuzz: $t for ${seconds}s ($san)"
  start=$SECONDS
  # shellcheck disable=SC2086
  cargo fuzz run -s "$san" "$t" "work/$t" "corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
    -print_final_stats=1 -artifact_prefix="artifacts/$t/" "${par[@]}" "${dict[@]}" ${FUZZ_ARGS:-} \
    >"$log" 2>&1
  rc=$?
  took=$((SECONDS - start))
  # libFuzzer's final stats, one per process (with FUZZ_JOBS > 1 in fuzz-N.log files).
  runs=$(cat "$log" fuzz-*.log 2>/dev/null | awk '/^stat::number_of_executed_units:/ {r += $2} END {printf "%d", r}')
  rm -f fuzz-*.log
  after=$(find "artifacts/$t" -type f ! -name '*.log' | wc -l)
  new=$((after - before))
  status=ok
  if [ "$rc" != 0 ] || [ "$new" -gt 0 ]; then
    status="FOUND $new (exit $rc; see $PWD/$log)"
    found=1
  fi
  summary+=("$(printf '%-12s %12s runs %6ss  %s' "$t" "$runs" "$took" "$status")")
done
echo
echo "fuzz summary (executions, seconds, result):"
printf '  %s\n' "${summary[@]}"
[ -n "$(find artifacts -type f ! -name '*.log' 2>/dev/null)" ] && echo "artifacts: $PWD/artifacts/"
exit $found
