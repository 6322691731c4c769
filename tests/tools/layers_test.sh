#!/usr/bin/env bash
# CTest: tools.layers_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# The include rule of the layer table (CMakeLists.txt, checked by tools/checks/check_layers.py) holds on
# the tree. First a self-test on a copy of the tree: an include that climbs a layer, a library
# including a test helper, and a declared edge that no include uses must each be reported, so a
# check that silently stopped looking would fail here instead of passing.
set -euo pipefail
src="$1"
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
check="$src/tools/checks/check_layers.py"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# A copy of the sources only (CMakeLists.txt and the source folders), without build trees.
(cd "$src" && find . -path './build*' -prune -o -path './.git' -prune -o \
   \( -name CMakeLists.txt -o -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print |
   while read -r f; do mkdir -p "$tmp/$(dirname "$f")"; cp "$f" "$tmp/$f"; done)
python3 "$check" "$tmp" >/dev/null || { echo "self-test: the unchanged copy fails:"; python3 "$check" "$tmp"; exit 1; }

expect_reported() {  # $1 what was planted, $2 text the report must contain
  if out="$(python3 "$check" "$tmp")"; then
    echo "self-test: $1 was accepted:"; echo "$out"; exit 1
  fi
  grep -qF "$2" <<<"$out" || { echo "self-test: $1 not reported as '$2':"; echo "$out"; exit 1; }
}
cp "$tmp/core/device.cpp" "$tmp/device.cpp.orig"
printf '#include "train/trainer.h"\n' >> "$tmp/core/device.cpp"
expect_reported "core including train/" "core/device.cpp:$(wc -l < "$tmp/core/device.cpp"): includes train/trainer.h (stp_train), but stp_core does not depend on stp_train"
cp "$tmp/device.cpp.orig" "$tmp/core/device.cpp"
printf '#include "tests/support/files.h"\n' >> "$tmp/memory/plan.cpp"
expect_reported "a library including a test helper" "memory/plan.cpp"
sed -i 's/^\(stp_library(stp_formats .*DEPENDS stp_core\)/\1 stp_schedule/' "$tmp/CMakeLists.txt"
expect_reported "an unused edge" "stp_formats DEPENDS on stp_schedule, but no file of stp_formats includes"

exec python3 "$check" "$src"
