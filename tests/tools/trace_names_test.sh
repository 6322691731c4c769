#!/usr/bin/env bash
# CTest: tools.trace_names_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# Trace stream and counter-track names are defined once, in base/trace_names.h, and spelled in no
# other source file outside tests/ (tools/checks/check_trace_names.py). First a self-test on a copy of the
# tree: a stream name spelled in a library, in a tool, as the start of a built name and in a
# comment must each be reported, a test may spell one, and a header whose name blocks are gone
# must fail the check, so a check that silently stopped looking fails here instead of passing.
set -euo pipefail
src="$1"
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
check="$src/tools/checks/check_trace_names.py"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# A copy of the C++ sources only, without build trees.
(cd "$src" && find . -path './build*' -prune -o -path './.git' -prune -o \
   \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print |
   while read -r f; do mkdir -p "$tmp/$(dirname "$f")"; cp "$f" "$tmp/$f"; done)
python3 "$check" "$tmp" >/dev/null || { echo "self-test: the unchanged copy fails:"; python3 "$check" "$tmp"; exit 1; }

q='"'
expect_reported() {  # $1 file of the copy to plant in, $2 the planted line, $3 text the report must contain
  cp "$tmp/$1" "$tmp/planted.orig"
  printf '%s\n' "$2" >> "$tmp/$1"
  if out="$(python3 "$check" "$tmp")"; then
    echo "self-test: '$2' in $1 was accepted:"; echo "$out"; exit 1
  fi
  grep -F "$1:$(wc -l < "$tmp/$1"): " <<<"$out" | grep -qF "$3" || {
    echo "self-test: '$2' in $1 not reported as '$3':"; echo "$out"; exit 1; }
  cp "$tmp/planted.orig" "$tmp/$1"
}
expect_reported train/executor.cpp "auto s = device.create_stream(${q}dp-comm${q});" \
  "spells the trace name ${q}dp-comm${q}; use trace::stream::kDpComm"
expect_reported tools/bench/bench_pool.cpp "auto s = dev.create_stream(${q}optimizer-cpu${q});" \
  "use trace::stream::kOptimizerCpu"
expect_reported schedule/deadlock.cpp "std::string n = str(${q}p2p ${q}, to_string(c));" \
  "spells the trace name ${q}p2p${q}; use trace::stream::kP2p"
expect_reported memory/block_arena.cpp "// counters ${q}pinned memory${q} per rank" \
  "use trace::track::kPinnedMemory"

# Tests may spell the names (they assert the exported format).
printf 'auto s = dev.create_stream(%scompute%s);\n' "$q" "$q" >> "$tmp/tests/core/stream_trace_test.cpp"
out="$(python3 "$check" "$tmp")" || { echo "self-test: a name spelled in a test was reported:"; echo "$out"; exit 1; }

# Without its name blocks the header defines nothing to look for: that is a failure, not a pass.
sed -i 's/^namespace stream {/namespace streams {/' "$tmp/base/trace_names.h"
if out="$(python3 "$check" "$tmp")"; then
  echo "self-test: a header without stream names was accepted:"; echo "$out"; exit 1
fi
grep -qF "has no stream names" <<<"$out" || { echo "self-test: missing stream names not reported:"; echo "$out"; exit 1; }

exec python3 "$check" "$src"
