#!/usr/bin/env bash
# CTest: tools.single_source_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# Every device functor is single-source (rules in single_source_check.py). First a self-test: a
# synthetic tree that breaks the source rules must be rejected, so a check that silently stopped
# looking would fail here instead of passing.
set -euo pipefail
src="$1" bin="$2" cuda="$3"
here="$(cd "$(dirname "$0")" && pwd)"
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/core/kernels" "$tmp/src/models" "$tmp/src/core/cuda" "$tmp/build"
printf 'struct Good {\n  STP_HD void operator()(unsigned long) const {}\n};\n' > "$tmp/src/core/kernels/a_kernels.cpp"
printf 'struct Hidden {\n  STP_HD void operator()(unsigned long) const {}\n};\nvoid f(){ launch(s, 1, Hidden{}); }\n' > "$tmp/src/models/bad.cpp"
printf '__global__ void k() {}\n' > "$tmp/src/core/cuda/own.cu"
printf 'struct Good {\n  STP_HD void operator()(unsigned long) const {}\n};\n' > "$tmp/src/models/dup_kernels.cpp"
if out="$(python3 "$here/single_source_check.py" --source "$tmp/src" --build "$tmp/build" --cuda OFF)"; then
  echo "self-test: a tree breaking the rules was accepted:"; echo "$out"; exit 1
fi
for rule in "S1 models/bad.cpp" "S2 core/cuda/own.cu" "S3 functor Good" "S4 "; do
  grep -qF "single-source: $rule" <<<"$out" || { echo "self-test: rule '$rule' not reported:"; echo "$out"; exit 1; }
done

exec python3 "$here/single_source_check.py" --source "$src" --build "$bin" --cuda "$cuda"
