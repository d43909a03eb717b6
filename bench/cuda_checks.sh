#!/usr/bin/env bash
# Runs every standalone CUDA decode-kernel check (build/cuda_checks/check_decode_*, except the ones
# that need a model) and prints a table. usage: bench/cuda_checks.sh [CHECK_DIR]
set -uo pipefail
dir=${1:-build/cuda_checks}
printf '%-28s %8s %8s %8s\n' check passed failed seconds
fail=0
for c in "$dir"/check_decode_*; do
  name=$(basename "$c")
  case $name in check_decode_e2e|check_decode_speed) continue ;; esac
  t0=$(date +%s%N)
  out=$(timeout 300 "$c" 2>&1); rc=$?
  t1=$(date +%s%N)
  echo "$out" | grep -E '^(FAIL|ok)' > "/tmp/$name.log"
  p=$(grep -c '^ok' "/tmp/$name.log"); f=$(grep -c '^FAIL' "/tmp/$name.log")
  printf '%-28s %8d %8d %8.1f%s\n' "$name" "$p" "$f" "$(awk -v a=$t0 -v b=$t1 'BEGIN{print (b-a)/1e9}')" "$([ $rc -ne 0 ] && echo "  (exit $rc)")"
  [ $rc -ne 0 ] && { fail=1; echo "$out" | grep -v '^ok' | tail -20; }
done
exit $fail
