#!/usr/bin/env bash
# Benchmark: peak resident memory of `stp tokenize` on a large text file (data/text_stream.h keeps
# it independent of the file's size). Generates SIZE_MB MB of text (the fortunes text, or --input's
# file, repeated, with a counter line between copies so that it is not one repeated string) in a
# scratch folder, tokenizes it with GPT-2's tokenizer under /usr/bin/time -v, prints the summary,
# the maximum resident set size and the check against the target, then removes the files.
#   tools/bench/bench_tokenize_memory.sh [--stp build/stp] [--mb 1000] [--limit-mib 512]
#       [--input FILE] [--tokenizer tests/data/tokenizer/gpt2] [--dir /tmp] [extra stp tokenize options]
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
stp="$src/build/stp" mb=1000 limit=512 input="" tokenizer="$src/tests/data/tokenizer/gpt2" dir="${TMPDIR:-/tmp}"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --stp) stp="$2"; shift 2 ;;
    --mb) mb="$2"; shift 2 ;;
    --limit-mib) limit="$2"; shift 2 ;;
    --input) input="$2"; shift 2 ;;
    --tokenizer) tokenizer="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
[ -x "$stp" ] || { echo "bench_tokenize_memory: no stp at $stp (build it: ninja -C build stp)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "bench_tokenize_memory: /usr/bin/time is missing (Debian package time)" >&2; exit 1; }
work="$(mktemp -d "$dir/bench_tokenize_memory.XXXXXX")"
trap 'rm -rf "$work"' EXIT
unit="$work/unit.txt"
if [ -n "$input" ]; then
  cp "$input" "$unit"
else
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' -print0 | LC_ALL=C sort -z | xargs -0 cat >"$unit"
fi
python3 - "$unit" "$work/big.txt" "$mb" <<'PY'
import sys
unit = open(sys.argv[1], "rb").read()
want = int(float(sys.argv[3]) * 1e6)
with open(sys.argv[2], "wb") as out:
    n, i = 0, 0
    while n < want:
        block = b"copy %d\n" % i + unit
        out.write(block)
        n += len(block)
        i += 1
PY
echo "input: $(du -m "$work/big.txt" | cut -f1) MiB of text ($work/big.txt)"
/usr/bin/time -v "$stp" tokenize "$tokenizer" "$work/big.txt" "$work/big.bin" "${extra[@]}" >"$work/out" 2>"$work/time"
cat "$work/out"
rss_kb="$(awk -F': *' '/Maximum resident set size/ {print $2}' "$work/time")"
wall="$(awk '/Elapsed \(wall clock\)/ {print $NF}' "$work/time")"
rss_mib=$((rss_kb / 1024))
status=ok
[ "$rss_mib" -lt "$limit" ] || status=MISSED
echo "peak resident memory: $rss_mib MiB ($rss_kb kB), wall $wall; target < $limit MiB: $status"
