#!/usr/bin/env bash
# CTest: tools.single_source_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# Every device functor is single-source, and no kernel tests the device kind (rules in
# single_source_check.py). First a self-test: a synthetic tree that breaks the source rules must be
# rejected, each break reported, so a check that silently stopped looking would fail here instead
# of passing.
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
# S5: kernels that test the device kind, directly or through the launch layer's own test; a comment
# that names DeviceKind is not a test.
printf '/* DeviceKind:\n   no test */\nvoid g(Stream& s) {\n  if (s.device().kind() == DeviceKind::Cpu) {}\n}\n' \
  > "$tmp/src/core/kernels/b_kernels.cpp"
printf 'inline int w(Stream& s) { return launch_detail::host_tasks(s) ? 16 : 1; }\n' > "$tmp/src/core/kernels/c.h"
printf 'inline int k(Device* d) { return d->kind() == 0; }\n' > "$tmp/src/core/kernels/d.h"
if out="$(python3 "$here/single_source_check.py" --source "$tmp/src" --build "$tmp/build" --cuda OFF)"; then
  echo "self-test: a tree breaking the rules was accepted:"; echo "$out"; exit 1
fi
for rule in "S1 models/bad.cpp" "S2 core/cuda/own.cu" "S3 functor Good" "S4 " \
  "S5 core/kernels/b_kernels.cpp:4 tests the device kind (.kind())" \
  "S5 core/kernels/b_kernels.cpp:4 tests the device kind (DeviceKind)" \
  "S5 core/kernels/c.h:1 tests the device kind (launch_detail)" "S5 core/kernels/d.h:1 tests the device kind (->kind())"; do
  grep -qF "single-source: $rule" <<<"$out" || { echo "self-test: rule '$rule' not reported:"; echo "$out"; exit 1; }
done
[[ "$(grep -c '^single-source: S5 ' <<<"$out")" == 4 ]] ||
  { echo "self-test: S5 reported other than the four planted tests (a comment is not a test):"; echo "$out"; exit 1; }

exec python3 "$here/single_source_check.py" --source "$src" --build "$bin" --cuda "$cuda"
