#!/usr/bin/env bash
# Instructions per estimate() at a new shape (callgrind, only the loop over 4,096 new shapes; the
# plan is compiled before it): a figure that a busy build machine does not move, for comparing two
# builds. Usage: tools/bench_instructions.sh [BUILD_DIR]   (default build/; needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
cmake --build "$build" --target membudget_estimate_loop >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for args in "configs/llama-3.1-8b.yaml" "configs/llama-3.1-70b.yaml" "tests/data/hf/moe/qwen3-30b-a3b.json" \
            "tests/data/hf/moe/mixtral-8x7b.json" "configs/llama-3.1-8b.yaml pp" "configs/llama-3.1-8b.yaml pp-fsdp"; do
  # shellcheck disable=SC2086
  valgrind --tool=callgrind --toggle-collect='run_loop*' --callgrind-out-file="$out/cg" \
    "$build/bench/membudget_estimate_loop" $args >/dev/null 2>&1
  ir=$(callgrind_annotate "$out/cg" | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  printf '%-45s %6d instructions per estimate\n' "$args" $((ir / 4096))
done
