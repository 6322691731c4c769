#!/usr/bin/env bash
# CTest: tools.commits_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# Commit hygiene (tools/checks/check_commits.py): every commit after the grandfathered base has a subject
# of at most 72 characters. First a self-test on a small repository made here: subjects of 72
# characters pass, one of 73 (and a first paragraph of two lines that together exceed 72) must be
# reported, a tree without .git and a history without the base must be skipped (77), so a check
# that silently stopped looking would fail here instead of passing. Then the source tree itself:
# skipped (77) with the check's reason where it has no history to read (a tarball, a shallow clone).
set -euo pipefail
src="$1"
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
command -v git >/dev/null || { echo "git not found: skipped"; exit 77; }
check="$src/tools/checks/check_commits.py"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
repo="$tmp/repo"
mkdir -p "$repo"
g() { git -C "$repo" -c user.name=test -c user.email=test@example.invalid -c commit.gpgsign=false "$@"; }
commit() { echo "$RANDOM" >> "$repo/file"; g add file; g commit -q -m "$1"; }
g init -q
commit "a grandfathered subject that is much longer than seventy-two characters, as old ones were"
base="$(g rev-parse HEAD)"
s72="$(printf 'x%.0s' $(seq 1 72))"
commit "$s72"
commit "short subject"$'\n\n'"a body line that is much longer than seventy-two characters is fine in the body"
out="$(python3 "$check" "$repo" --base "$base")" ||
  { echo "self-test: subjects of at most 72 characters were refused:"; echo "$out"; exit 1; }
grep -qF "2 commit(s) after" <<<"$out" || { echo "self-test: the two new commits were not counted:"; echo "$out"; exit 1; }

expect_reported() {  # $1 what was planted, $2 text the report must contain
  local status=0
  out="$(python3 "$check" "$repo" --base "$base")" || status=$?
  [ "$status" -eq 1 ] || { echo "self-test: $1: status $status, expected 1:"; echo "$out"; exit 1; }
  grep -qF "$2" <<<"$out" || { echo "self-test: $1 not reported as '$2':"; echo "$out"; exit 1; }
}
commit "y$s72"
expect_reported "a subject of 73 characters" "subject of 73 characters"
g reset -q --hard HEAD~1
commit "a first line of forty characters or so,"$'\n'"and a second line without a blank line before it"
expect_reported "a two-line first paragraph" "subject of 88 characters"
g reset -q --hard HEAD~1

expect_skipped() {  # $1 what, $2 text the message must contain, then the check's arguments
  local what="$1" text="$2" status=0
  shift 2
  out="$(python3 "$check" "$@")" || status=$?
  [ "$status" -eq 77 ] || { echo "self-test: $what: status $status, expected 77 (skipped):"; echo "$out"; exit 1; }
  grep -qF "$text" <<<"$out" || { echo "self-test: $what: no '$text' in:"; echo "$out"; exit 1; }
}
mkdir -p "$tmp/export/sub"
cp "$repo/file" "$tmp/export/"
expect_skipped "a tree without .git" "not the top of a git work tree" "$tmp/export"
cp -r "$tmp/export" "$repo/export"  # a tarball unpacked inside another repository
expect_skipped "a tree inside another repository" "not the top of a git work tree" "$repo/export"
rm -rf "$repo/export"
expect_skipped "a history without the base" "is not in this repository" "$repo" --base 0123456789abcdef0123456789abcdef01234567
git clone -q --depth 1 "file://$repo" "$tmp/shallow" 2>/dev/null
expect_skipped "a shallow clone" "shallow clone" "$tmp/shallow" --base "$base"

exec python3 "$check" "$src"
