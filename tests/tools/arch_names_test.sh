#!/usr/bin/env bash
# CTest: tools.arch_names_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# Nothing in train/ names an architecture (CONTRIBUTING.md, Adding an architecture): train/ asks the
# model registry (models/registry.h) for what depends on one. The names are those of the registry's
# entries (`.name = "..."` in models/*_arch.cpp); the code of train/ (comments left out) must not
# contain any of them at the start of a word, in any case: no `arch == "llama"`, no
# `llama_architecture()`, no `GPT2Stage`, no include of models/gpt2_params.h. First a self-test on
# a small synthetic tree: a clean tree must pass, and each planted use must be reported, so a check
# that silently stopped looking fails here instead of passing.
set -euo pipefail
src="$1"

# Prints the offending lines of ROOT/train/ and fails when there are any.
check() {
  local root="$1" names pattern
  names="$(sed -nE 's/^[[:space:]]*\.name = "([A-Za-z0-9_]+)",?$/\1/p' "$root"/models/*_arch.cpp | sort -u)"
  [[ "$(wc -w <<<"$names")" -ge 2 ]] || { echo "found no architecture names in $root/models/*_arch.cpp"; return 2; }
  pattern="\\b($(paste -sd'|' <<<"$names"))"
  local found=0 f
  while IFS= read -r f; do
    # Comments out (a line's "//" tail), then look for a word starting with a name.
    if out="$(sed -E 's://.*$::' "$f" | grep -niE "$pattern")"; then
      sed "s|^|${f#"$root"/}:|" <<<"$out"
      found=1
    fi
  done < <(find "$root/train" -type f \( -name '*.h' -o -name '*.cpp' \) | sort)
  if [[ $found -eq 1 ]]; then
    echo "train/ names an architecture ($(paste -sd' ' <<<"$names")): ask the model registry instead"
    return 1
  fi
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/models" "$tmp/train"
printf '  static const Architecture a{\n      .name = "gpt2",\n' > "$tmp/models/gpt2_arch.cpp"
printf '  static const Architecture a{\n      .name = "llama",\n' > "$tmp/models/llama_arch.cpp"
printf '// The head (gpt2: wte; llama: lm_head) comes from the registry.\nint f(const Config& c);\n' \
  > "$tmp/train/clean.cpp"
out="$(check "$tmp")" || { echo "self-test: the clean tree fails:"; echo "$out"; exit 1; }

expect_reported() {  # $1 file to plant, $2 its line, $3 text the report must contain
  printf '%s\n' "$2" > "$1"
  if out="$(check "$tmp")"; then
    echo "self-test: '$2' in $1 was accepted:"; echo "$out"; exit 1
  fi
  grep -qF "$3" <<<"$out" || { echo "self-test: '$2' in $1 not reported as '$3':"; echo "$out"; exit 1; }
  rm "$1"
}
expect_reported "$tmp/train/a.cpp" '  if (c.model.arch == "llama") {' "train/a.cpp:1:"
expect_reported "$tmp/train/b.h" '  const bool tied = m.arch == "gpt2";  // GPT-2 always ties' "train/b.h:1:"
expect_reported "$tmp/train/c.cpp" '#include "models/gpt2_params.h"' "train/c.cpp:1:"
expect_reported "$tmp/train/d.cpp" '  const Architecture& a = llama_architecture();' "train/d.cpp:1:"
expect_reported "$tmp/train/e.cpp" '  auto s = std::make_unique<GPT2Stage>(m, spec, alloc);' "train/e.cpp:1:"
out="$(check "$tmp")" || { echo "self-test: the tree fails after the plants were removed:"; echo "$out"; exit 1; }

check "$src"
