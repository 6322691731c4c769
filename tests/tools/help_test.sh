#!/usr/bin/env bash
# CTest: tools.help_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# Every executable's command line (tools/cli/cli.h): `stp`, each `stp` subcommand and every bench_*
# in BINARY_DIR (found by globbing, so a new benchmark is covered without editing this file):
#   * --help exits 0 and names the documented options: for `stp`, the commands of README.md
#     "Commands"; for a benchmark, every --option the header comment of tools/bench/NAME.cpp names;
#   * --version exits 0 and prints "NAME VERSION", VERSION being project(VERSION) of CMakeLists.txt
#     (NAME "stp CMD" for each subcommand);
#   * an unknown option exits 1 with one line on stderr that names it, and nothing on stdout.
# Skipped (77) when none of them is built.
set -uo pipefail
src="$1" bin="$2"

version="$(sed -n 's/^project(stp VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")"
[ -n "$version" ] || { echo "no project(stp VERSION x.y.z) in $src/CMakeLists.txt"; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0 checked=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# check_help NAME "CMD ARGS..." OPTION...: --help exits 0 and mentions each OPTION.
check_help() {
  local name="$1" cmd="$2"; shift 2
  if ! $cmd --help >"$tmp/out" 2>"$tmp/err"; then fail "$name --help exited $? ($(head -c 300 "$tmp/err"))"; return; fi
  for opt in "$@"; do
    grep -qF -- "$opt" "$tmp/out" || fail "$name --help does not mention $opt"
  done
  checked=$((checked + 1))
}

# check_version NAME "CMD": --version exits 0 and prints "NAME VERSION".
check_version() {
  local name="$1" cmd="$2"
  $cmd --version >"$tmp/out" 2>"$tmp/err"
  local status=$?
  if [ "$status" -ne 0 ]; then fail "$name --version exited $status ($(head -c 200 "$tmp/err"))"; return; fi
  grep -qE "^$name $version( |\$)" "$tmp/out" || fail "$name --version printed '$(cat "$tmp/out")', expected '$name $version ...'"
}

# check_unknown NAME "CMD ARGS...": an unknown option is one error line naming it, status 1.
check_unknown() {
  local name="$1" cmd="$2" bad="--no-such-option"
  $cmd $bad >"$tmp/out" 2>"$tmp/err"
  local status=$?
  [ "$status" -eq 1 ] || fail "$name $bad exited $status, expected 1"
  [ -s "$tmp/out" ] && fail "$name $bad wrote to stdout: $(head -c 200 "$tmp/out")"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "$name $bad: stderr is not one line: $(cat "$tmp/err")"
  grep -q "^$name: error: .*$bad" "$tmp/err" || fail "$name $bad: stderr does not say '$name: error: ... $bad': $(cat "$tmp/err")"
}

if [ -x "$bin/stp" ]; then
  stp="$bin/stp"
  check_help stp "$stp" train plan sim profile plot generate --version
  check_version stp "$stp"
  check_unknown stp "$stp"
  # The contracts of README.md "Commands" (also called by tools/gpu-check and the tests).
  check_help "stp train" "$stp train" CONFIG.yaml --set
  check_help "stp plan" "$stp plan" CONFIG.yaml --set --json --bytes
  check_help "stp sim" "$stp sim" --schedule --pp --microbatches --tf --tb --tw --tar --tp2p --units --issue \
    --json --svg --trace --compare --check-deadlock --p2p-streams
  check_help "stp profile" "$stp profile" RUN_DIR --json --svg --steps
  check_help "stp plot" "$stp plot" RUN_DIR --svg
  check_help "stp generate" "$stp generate" CHECKPOINT --prompt --tokens --temperature --top-k --seed --tokenizer
  check_help "stp tokenize" "$stp tokenize" TOKENIZER INPUT OUTPUT --invalid-utf8 --shard-tokens --eot --jsonl \
    --text-field --prompt-field --completion-field --messages-field --chunk-bytes STPMASK1
  for cmd in train plan sim profile plot generate; do
    check_unknown "stp $cmd" "$stp $cmd"
    check_version "stp $cmd" "$stp $cmd"  # README.md: every command answers --version
  done
  # Usage errors that are not options: one line too.
  $stp >"$tmp/out" 2>"$tmp/err" && fail "stp without a command exited 0"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "stp without a command: stderr is not one line: $(cat "$tmp/err")"
  $stp nosuchcommand >"$tmp/out" 2>"$tmp/err" && fail "stp nosuchcommand exited 0"
  grep -q "^stp: error: unknown command 'nosuchcommand'" "$tmp/err" || fail "stp nosuchcommand: $(cat "$tmp/err")"
fi

for exe in "$bin"/bench_*; do
  [ -f "$exe" ] && [ -x "$exe" ] || continue
  name="$(basename "$exe")"
  header="$src/tools/bench/$name.cpp"
  # The options the file's header comment (its leading // lines) names.
  opts=()
  if [ -f "$header" ]; then
    mapfile -t opts < <(sed -n '/^\/\//!q; p' "$header" | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u)
  else
    fail "$name: no $header to read its documented options from"
  fi
  check_help "$name" "$exe" --version "${opts[@]}"
  check_version "$name" "$exe"
  check_unknown "$name" "$exe"
done

if [ "$checked" -eq 0 ]; then echo "neither stp nor a benchmark is built in $bin: skipped"; exit 77; fi
if [ "$failures" -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "help_test: --help, --version and unknown options checked on $checked command lines"
