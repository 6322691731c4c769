#!/usr/bin/env bash
# Installs what is missing (Debian packages), configures and builds stp into build/.
# Usage: tools/setup.sh [--all] [extra cmake -D options]
#   By default only what `stp train` needs is built (the stp executable and its libraries);
#   --all builds every target: tests, benchmarks (tools/test.sh and tools/gpu-check use it).
# Env: STP_BUILD_DIR (default build), STP_JOBS (default: nproc), STP_BUILD_ALL=1 (= --all),
#   STP_CUDA: unset (or AUTO): the CUDA backend is built only when nvidia-smi shows a GPU (and nvcc
#   is found), for the architectures of the GPUs it shows; ON: built for every configured
#   architecture (STP_CUDA_ARCHITECTURES in cmake/Cuda.cmake, 80;90, or -DSTP_CUDA_ARCHITECTURES=),
#   whether a GPU is visible or not (configuring fails without nvcc); OFF: never built.
#   A -DSTP_CUDA=... among the cmake options wins over all of this (tools/test.sh and
#   tools/gpu-check pass one).
# Output: one line per phase; each phase's full output goes to a log beside the build folder
# (build.apt.log, build.configure.log, build.build.log), whose last lines are shown on failure.
# ccache, when installed, is used as the compiler launcher unless the options name another.
set -euo pipefail
cd "$(dirname "$0")/.."

# One package per line (keep it that way: several changes add packages at once).
packages=(
  cmake
  g++
  ninja-build
  pkg-config
  libtbb-dev
  libhwloc-dev
  libjemalloc-dev
  libyaml-cpp-dev
  libopenblas-dev
  libgtest-dev
  libcli11-dev
  nlohmann-json3-dev
  libsimdjson-dev
  libpcre2-dev
  fortunes
  time
  libopenmpi-dev
  openmpi-bin
)

build_all="${STP_BUILD_ALL:-0}"
cmake_args=()
for a in "$@"; do
  case "$a" in
    --all) build_all=1 ;;
    *) cmake_args+=("$a") ;;
  esac
done
build_dir="${STP_BUILD_DIR:-build}"
jobs="${STP_JOBS:-$(nproc)}"
mkdir -p "$(dirname "$build_dir")"  # where the logs go

# "12s", "2m31s"
elapsed() {
  local s=$((SECONDS - $1))
  if ((s < 60)); then echo "${s}s"; else printf '%dm%02ds\n' $((s / 60)) $((s % 60)); fi
}
# phase LOG LABEL COMMAND...: runs COMMAND with its output in LOG, on one line of ours.
phase() {
  local log="$1" label="$2" t0=$SECONDS
  shift 2
  printf 'stp setup: %s ... ' "$label"
  if "$@" >"$log" 2>&1; then
    echo "done in $(elapsed "$t0") (log: $log)"
  else
    local rc=$?
    echo "FAILED (status $rc)"
    echo "stp setup: the last 30 lines of $log:" >&2
    tail -n 30 "$log" >&2
    echo "stp setup: full log: $log" >&2
    exit "$rc"
  fi
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  [ "$(id -u)" -ne 0 ] && sudo -v  # ask for a password (if any) here, not inside the log
  # (Called as a phase, where `set -e` does not apply: hence the &&.)
  install_packages() {
    echo "installing: ${missing[*]}"
    # env inside sudo: sudo drops the caller's environment. No terminal: nothing may ask.
    "${sudo_cmd[@]}" apt-get update </dev/null &&
      "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" </dev/null
  }
  noun=packages
  ((${#missing[@]} == 1)) && noun=package
  phase "$build_dir.apt.log" "installing ${#missing[@]} $noun" install_packages
fi

# The CUDA backend: compiling it takes longer than everything else together, so it is built where
# it can run (a visible GPU, for that GPU's architectures only) or when asked.
cuda_args=()
cuda_note=""
cuda_mode="$(echo "${STP_CUDA:-AUTO}" | tr '[:lower:]' '[:upper:]')"
if [[ " ${cmake_args[*]} " == *" -DSTP_CUDA="* ]]; then
  cuda_mode=ARGS  # the caller decides
fi
case "$cuda_mode" in
  ARGS) ;;
  OFF) cuda_args=(-DSTP_CUDA=OFF) ;;
  ON)
    cuda_args=(-DSTP_CUDA=ON)
    # Every configured architecture, not the ones an earlier run of this script detected.
    [[ " ${cmake_args[*]} " == *" -DSTP_CUDA_ARCHITECTURES="* ]] || cuda_args+=(-USTP_CUDA_ARCHITECTURES)
    ;;
  AUTO)
    # Compute capabilities of the visible GPUs ("9.0" -> 90), distinct, in order.
    archs=""
    gpus=0
    if command -v nvidia-smi >/dev/null; then
      gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
      archs="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
        sed -n 's/^ *\([0-9]\+\)\.\([0-9]\+\) *$/\1\2/p' | sort -un | paste -sd ';' || true)"
    fi
    if ((gpus > 0)); then
      # A driver too old to report compute_cap: let CMake ask the GPU itself.
      cuda_args=(-DSTP_CUDA=AUTO -DSTP_CUDA_ARCHITECTURES="${archs:-native}")
      cuda_note="$gpus GPU(s) visible: the CUDA backend is built (when nvcc is found) for architectures ${archs:-native}"
    else
      cuda_args=(-DSTP_CUDA=OFF)
      if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
        cuda_note="no GPU visible (nvidia-smi): the CUDA backend is not built (STP_CUDA=ON builds it)"
      fi
    fi
    ;;
  *) echo "stp setup: STP_CUDA must be ON, OFF or AUTO (unset), got '${STP_CUDA}'" >&2; exit 2 ;;
esac
[ -n "$cuda_note" ] && echo "stp setup: $cuda_note"

launcher=()
if command -v ccache >/dev/null && [[ " ${cmake_args[*]} " != *" -DCMAKE_CXX_COMPILER_LAUNCHER="* ]]; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
phase "$build_dir.configure.log" "configuring $build_dir" \
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" "${cuda_args[@]}" \
  "${cmake_args[@]}"
grep -E "^-- stp:" "$build_dir.configure.log" || true

if [ "$build_all" = 1 ]; then
  phase "$build_dir.build.log" "building every target with $jobs jobs" cmake --build "$build_dir" -j "$jobs"
else
  phase "$build_dir.build.log" "building stp with $jobs jobs" cmake --build "$build_dir" -j "$jobs" --target stp
fi
