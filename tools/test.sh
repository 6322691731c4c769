#!/usr/bin/env bash
# Runs the whole stp test suite from a clean clone: installs what is missing, builds every target
# (tools/setup.sh --all), runs ctest.
#   tools/test.sh               release build (warnings as errors) + every test suite, then the
#                               core, models, optim and train suites again as an AVX2-only x86-64
#                               CPU runs them (STP_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell; skipped
#                               on a CPU without AVX2, where the first run was that already)
#   tools/test.sh --sanitizers  also the runtime suites under ThreadSanitizer and ASan+UBSan, and
#                               the readers' fuzz tests under ASan+UBSan
set -euo pipefail
cd "$(dirname "$0")/.."
sanitizers=0
for a in "$@"; do
  case "$a" in
    --sanitizers) sanitizers=1 ;;
    *) echo "usage: tools/test.sh [--sanitizers]" >&2; exit 2 ;;
  esac
done
jobs="${STP_JOBS:-$(nproc)}"

# -DSTP_CUDA=AUTO: the CUDA backend is compiled, with warnings as errors, wherever nvcc is found,
# GPU or not (tools/setup.sh alone builds it only for a visible GPU); its GPU cases skip without one.
STP_BUILD_DIR=build tools/setup.sh --all -DSTP_WERROR=ON -DSTP_CUDA=AUTO
(cd build && ctest --output-on-failure -j "$jobs")

# The kernel, model and training suites once more with the arithmetic of an AVX2-only CPU, on any
# machine: stp's AVX-512 paths off (STP_CPU_ISA, core/kernels/cpu_isa.h) and OpenBLAS's Haswell
# kernels, the ones it runs on AVX2 CPUs (OPENBLAS_CORETYPE; it picks by CPU). The tolerances must
# hold for that arithmetic as well as for this machine's.
if grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
  echo "== core, models, optim and train suites as an AVX2-only CPU (STP_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell) =="
  (cd build && STP_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell ctest --output-on-failure -j "$jobs" \
     -L '^(core|models|optim|train)$')
else
  echo "== no AVX2 on this CPU: the suites above ran its arithmetic; no second pass =="
fi

if ((sanitizers)); then
  for san in thread address; do
    echo "== runtime tests under ${san} sanitizer =="
    STP_BUILD_DIR="build-$san" tools/setup.sh --all -DSTP_WERROR=ON -DSTP_SANITIZE="$san" -DSTP_RUNTIME_ONLY=ON \
      -DCMAKE_BUILD_TYPE=Debug
    # The address build also holds the readers' fuzz tests (label fuzz, tests/CMakeLists.txt).
    # OPENBLAS_NUM_THREADS=1: OpenBLAS hands a large GEMM to its own worker threads through
    # spin-waits in uninstrumented code, which ThreadSanitizer cannot see (it reports the stream's
    # earlier writes to C as races with the worker). stp's own concurrency is what is under test.
    (cd "build-$san" && OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
       ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
       ctest --output-on-failure -j "$jobs")
  done
fi
