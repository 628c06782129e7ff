#!/usr/bin/env bash
# Runs libiscsi's compliance suite (iscsi-test-cu) against a running target, one test per
# invocation (so a hang is one TIMEOUT, not a lost run), and prints a summary:
#   scripts/compliance.sh [-o OUTDIR] [-t PATTERN] URL [URL2]
# URL2 (the same LUN again) adds the MultipathIO tests. --allow-sanitize runs the SANITIZE
# tests too (they destroy the LUN's data, as --dataloss allows). Per-test logs of failures go to
# OUTDIR (default: a temp dir). Exit status: 0 when nothing FAILED or TIMED OUT.
set -uo pipefail
out=$(mktemp -d /tmp/compliance.XXXXXX)
pattern='.'
while getopts "o:t:" opt; do
  case $opt in
    o) out=$OPTARG; mkdir -p "$out" ;;
    t) pattern=$OPTARG ;;
    *) echo "usage: $0 [-o OUTDIR] [-t PATTERN] URL [URL2]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-o OUTDIR] [-t PATTERN] URL [URL2]" >&2; exit 2; }
command -v iscsi-test-cu >/dev/null || { echo "iscsi-test-cu missing: apt-get install libiscsi-bin" >&2; exit 2; }
res="$out/results.txt"
: > "$res"
for t in $(iscsi-test-cu --list | grep -E '^ALL\.[^.]+\.[^.]+$' | grep -E -- "$pattern"); do
  log="$out/$t.log"
  timeout 60 iscsi-test-cu --dataloss --allow-sanitize -i iqn.2024-01.test:init1 -I iqn.2024-01.test:init2 -t "$t" "$@" >"$log" 2>&1
  rc=$?
  # CUnit's own verdict: the "tests" row of the run summary (helpers print "[FAILED]"
  # lines for expected failures inside passing tests, so those lines prove nothing).
  tests_failed=$(awk '$1 == "tests" {print $5}' "$log")
  if [ $rc = 124 ]; then r=TIMEOUT
  elif [ $rc != 0 ] || [ "${tests_failed:-1}" != 0 ]; then r=FAILED
  elif grep -q 'SKIPPED' "$log"; then r=SKIPPED
  else r=PASSED; fi
  echo "$r $t" >> "$res"
  [ "$r" = PASSED ] && rm -f "$log"
done
passed=$(grep -c '^PASSED' "$res"); failed=$(grep -c '^FAILED\|^TIMEOUT' "$res"); skipped=$(grep -c '^SKIPPED' "$res")
grep -v '^PASSED' "$res" | sort
echo "logs: $out"
echo "compliance: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
