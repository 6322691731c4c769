#!/usr/bin/env bash
# Installs what is missing (Debian packages), configures and builds stp into build/.
# Usage: tools/setup.sh [extra cmake -D options]
# Env: STP_BUILD_DIR (default build), STP_JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ ninja-build pkg-config libtbb-dev libhwloc-dev libjemalloc-dev libyaml-cpp-dev
          libopenblas-dev libgtest-dev nlohmann-json3-dev libsimdjson-dev fortunes libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "stp setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

build_dir="${STP_BUILD_DIR:-build}"
jobs="${STP_JOBS:-$(nproc)}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" > "$build_dir.configure.log" 2>&1 \
  || { cat "$build_dir.configure.log"; exit 1; }
grep -E "^-- stp:" "$build_dir.configure.log" || true
cmake --build "$build_dir" -j "$jobs"
