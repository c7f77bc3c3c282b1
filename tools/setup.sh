#!/usr/bin/env bash
# Installs the Debian packages membudget needs and builds it into build/. Idempotent.
# emscripten and chromium are for the web page and its test (docs/web.md): emscripten's own
# Depends (clang-14, lld-14, binaryen, nodejs, node-acorn) are all it needs, and its package ships
# the prebuilt system libraries in /usr/share/emscripten/cache, which root can write to.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs="cmake ninja-build g++ libyaml-cpp-dev libcli11-dev doctest-dev libeigen3-dev nlohmann-json3-dev
      pybind11-dev python3-pybind11 python3-dev python3-pytest python3-venv python3-pip python3-setuptools python3-wheel libbenchmark-dev pkg-config clang libclang-rt-14-dev
      emscripten chromium"
missing=$(for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
