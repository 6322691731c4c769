#!/usr/bin/env bash
# CTest: tools.tree_rules_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# Which folders may name what (tools/checks/check_tree.py). First a self-test: a synthetic tree that
# breaks each rule must be reported, so a check that silently stopped looking fails here instead
# of passing. The planted names are assembled from pieces so that this file passes the check.
set -euo pipefail
src="$1"
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
check="$src/tools/checks/check_tree.py"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/train" "$tmp/optim" "$tmp/tools/stp"
printf '// drives a RankOptimizer, never its HostUpdate directly\nauto s = "// not a comment";\n' > "$tmp/train/ok.cpp"
printf 'auto o = std::make_unique<Replicated''Optimizer>(x);\n' > "$tmp/optim/rank_optimizer.cpp"
out="$(python3 "$check" "$tmp")" || { echo "self-test: the clean tree fails:"; echo "$out"; exit 1; }

expect_reported() {  # $1 file to plant, $2 its line, $3 the rule the report must name
  printf '%s\n' "$2" > "$1"
  if out="$(python3 "$check" "$tmp")"; then
    echo "self-test: '$2' in $1 was accepted:"; echo "$out"; exit 1
  fi
  grep -qF "$3 ${1#"$tmp/"}:1:" <<<"$out" || { echo "self-test: '$2' in $1 not reported by $3:"; echo "$out"; exit 1; }
  rm "$1"
}
expect_reported "$tmp/train/a.cpp" "  if (r.host_update) r.Host""Update->settle();" optimizer-seam
expect_reported "$tmp/train/b.h" '#include "optim/distributed''_optimizer.h"' optimizer-seam
expect_reported "$tmp/tools/stp/c.cpp" "stp::DpGrad""Sync sync;" optimizer-seam
expect_reported "$tmp/train/e.cpp" "auto s = \"//\"; Host""Update* h;" optimizer-seam
expect_reported "$tmp/optim/d.cpp" "return std::make_unique<Offloaded""Optimizer>(o);" optimizer-factory

exec python3 "$check" "$src"
