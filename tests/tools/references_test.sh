#!/usr/bin/env bash
# CTest: tools.references_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# The repository stands on its own (tools/checks/check_references.py): code and docs cite only files of
# the tree, no issue numbers, no review labels in code, and every repository path they name
# exists. First a self-test on a small synthetic tree: a clean tree must pass, and each planted
# bad reference must be reported, so a check that silently stopped looking fails here instead of
# passing. The planted strings are assembled from pieces so that this file passes the check itself.
set -euo pipefail
src="$1"
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
check="$src/tools/checks/check_references.py"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/core" "$tmp/docs" "$tmp/tools/reference"
printf '// A clean header: see docs/a.md, Section, and core/good.h; tools/stp/cmd_NAME.cpp is a placeholder.\n' \
  > "$tmp/core/good.h"
printf '# The tree'"'"'s own generators: tools/reference/gen.py.\n' > "$tmp/tools/reference/gen.py"
printf '# A\n\nSee [b](b.md) and `core/good.h`. Findings keep their labels here: (O'""'7).\n' > "$tmp/docs/a.md"
printf '# B\n' > "$tmp/docs/b.md"
out="$(python3 "$check" "$tmp")" || { echo "self-test: the clean tree fails:"; echo "$out"; exit 1; }

section=$'\xc2\xa7'
expect_reported() {  # $1 file to plant, $2 its line, $3 text the report must contain
  printf '%s\n' "$2" > "$1"
  if out="$(python3 "$check" "$tmp")"; then
    echo "self-test: '$2' in $1 was accepted:"; echo "$out"; exit 1
  fi
  grep -qF "$3" <<<"$out" || { echo "self-test: '$2' in $1 not reported as '$3':"; echo "$out"; exit 1; }
  rm "$1"
}
expect_reported "$tmp/core/a.cpp" "// see DES""IGN.md for the contract" "core/a.cpp:1: cites the design page"
expect_reported "$tmp/core/a.h" "// the rule of stp-sp""ec ${section}4.2" "core/a.h:1: cites a reference note"
expect_reported "$tmp/tools/a.py" "# as in the STP sp""ec ${section}5" "tools/a.py:1: cites a reference note"
expect_reported "$tmp/tools/a.sh" "# notes in ../sha""red/refer""ence/x.md" "tools/a.sh:1: cites a reference note"
expect_reported "$tmp/tools/b.sh" "# notes in refer""ence/x.md" "tools/b.sh:1: cites a reference note"
expect_reported "$tmp/core/a.cu" "// drawn at three levels (aesthe""tics L1)" "core/a.cu:1: cites the style notes"
expect_reported "$tmp/core/b.h" "// see the page, ${section}3" "core/b.h:1: cites a section number"
expect_reported "$tmp/core/CMakeLists.txt" "# needed since issue "'#'"8" "core/CMakeLists.txt:1: cites an issue number"
expect_reported "$tmp/core/c.h" "// fixed in "'#'"12" "core/c.h:1: cites an issue number"
expect_reported "$tmp/core/d.h" "// the ordering bug of Megatron-LM"'#'"7398" "core/d.h:1: cites an issue of another tracker"
expect_reported "$tmp/core/e.cpp" "int x;  // cublas workspace (O""7)" "core/e.cpp:1: carries a finding label"
expect_reported "$tmp/core/f.h" "// see core/no""where.h" "core/f.h:1: names a path that does not exist: core/no""where.h"
expect_reported "$tmp/core/g.h" "// the communicators live in core/m""pi/ now" "core/g.h:1: names a path that does not exist: core/m""pi/"
expect_reported "$tmp/docs/c.md" "Described in docs/miss""ing.md." "docs/c.md:1: names a path that does not exist: docs/miss""ing.md"
expect_reported "$tmp/docs/d.md" "See [it](miss""ing.md)." "docs/d.md:1: links to a file that does not exist: missing.md"
expect_reported "$tmp/docs/e.md" "As DES""IGN.md says" "docs/e.md:1: cites the design page"
out="$(python3 "$check" "$tmp")" || { echo "self-test: the tree fails after the plants were removed:"; echo "$out"; exit 1; }

exec python3 "$check" "$src"
