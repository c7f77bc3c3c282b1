#!/usr/bin/env bash
# The sanitizer build: the library, the CLI and the unit tests (the doctest suites and the C ABI
# test) built with clang and -fsanitize=address,undefined,float-cast-overflow into
# build-sanitize/, then run. clang's UBSan reports a double cast to an integer it cannot hold,
# which GCC's does not (docs/robustness.md). No CUDA, benchmarks, Python module or fuzz targets:
# tools/test.sh covers those. CI runs it after tools/test.sh (.ci/run); about 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang++ >/dev/null || bash tools/setup.sh  # clang and its sanitizer runtimes
san="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# -O1 with line tables: symbolized reports at about half the compile time of -O2 -g.
cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" \
  -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san" -DCMAKE_MODULE_LINKER_FLAGS="$san" \
  -DMEMBUDGET_CUDA=OFF -DMEMBUDGET_FUZZ=OFF -DMEMBUDGET_PYTHON=OFF -DMEMBUDGET_BENCH=OFF >/dev/null
# The unit tests and the CLI they run; nothing else.
targets=$(cmake --build build-sanitize --target help | sed -n 's/^\(test_[a-z0-9_]*\|c_api_test\|membudget_cli\): .*/\1/p')
cmake --build build-sanitize -j "$(nproc)" --target $targets
# Leak checking needs ptrace, which containers often refuse; the leaks are not what this run is for.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:check_initialization_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-sanitize --output-on-failure -j "$(nproc)" -R '^(test_.*|c_api_test)$' -LE gpu
