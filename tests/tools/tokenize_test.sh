#!/usr/bin/env bash
# CTest: tools.tokenize_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# `stp tokenize` end to end with GPT-2's vocabulary (tests/data/tokenizer/):
#   * the fortunes text (the Debian fortunes package's text files, each encoded alone, in name
#     order) gives byte for byte the llm.c file of the gpt-3-encoder reference (fortunes.llmc.gz);
#     skipped when the package is missing or another version (fortunes.sha256);
#   * invalid UTF-8 is an error naming the file and offset (status 1), and --invalid-utf8 replace
#     gives the reference ids of the text after U+FFFD substitution;
#   * missing tokenizer / input, and an empty input folder, are one-line errors with status 1;
#   * OUTPUT naming INPUT, a tokenizer file, a file inside an input folder or a run's file is an
#     error that leaves it as it was; an earlier output is replaced whole; /dev/zero as INPUT or
#     TOKENIZER is refused; a tokenizer.json id at or above 2^22 is an error naming it;
#   * a BPE model end to end: a small GPT-2 trained for 2 steps on tokenized text, then
#     `stp generate --tokenizer` prints the prompt and a continuation, the same for the same seed;
#     without --tokenizer it is a one-line error;
#   * the tokenizer travels with the model: trained with data.tokenizer, the checkpoint carries the
#     GPT-2 files as vocab.json + merges.txt (byte for byte), and `stp generate CHECKPOINT` without
#     --tokenizer prints what it prints with --tokenizer;
# Skipped (77) when stp is not built.
set -uo pipefail
src="$1" bin="$2"
stp="$bin/stp"
[ -x "$stp" ] || { echo "stp not built"; exit 77; }
data="$src/tests/data/tokenizer"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# llmc FILE < ids (one per line): writes the llm.c token file of those ids.
llmc() { python3 -c '
import struct, sys
ids = [int(x) for x in sys.stdin.read().split()]
sys.stdout.buffer.write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)) + struct.pack("<%dH" % len(ids), *ids))
' >"$1"; }

# expect_error STATUS NEEDLE CMD...: CMD exits STATUS with one stderr line containing NEEDLE.
expect_error() {
  local want="$1" needle="$2"; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local status=$?
  [ "$status" -eq "$want" ] || fail "$* exited $status, expected $want ($(cat "$tmp/err"))"
  grep -qF -- "$needle" "$tmp/err" || fail "$*: stderr does not mention '$needle': $(cat "$tmp/err")"
  [ "$(grep -c . "$tmp/err")" -eq 1 ] || fail "$*: stderr is not one line: $(cat "$tmp/err")"
}

# The adversarial text through the command line (one file input).
"$stp" tokenize "$data/gpt2" "$data/adversarial.txt" "$tmp/adv.bin" >"$tmp/out" 2>"$tmp/err" ||
  fail "stp tokenize adversarial.txt: $(cat "$tmp/err")"
llmc "$tmp/adv.want" <"$data/adversarial.ids"
cmp -s "$tmp/adv.bin" "$tmp/adv.want" || fail "adversarial.txt: ids differ from the reference"
grep -q "data.format llmc" "$tmp/out" || fail "the summary does not name the format: $(cat "$tmp/out")"

# Invalid UTF-8.
expect_error 1 "offset 12" "$stp" tokenize "$data/gpt2" "$data/invalid_utf8.txt" "$tmp/bad.bin"
[ -e "$tmp/bad.bin" ] && fail "an output file was written despite the error"
"$stp" tokenize --invalid-utf8 replace "$data/gpt2" "$data/invalid_utf8.txt" "$tmp/rep.bin" >/dev/null 2>"$tmp/err" ||
  fail "--invalid-utf8 replace: $(cat "$tmp/err")"
llmc "$tmp/rep.want" <"$data/invalid_utf8.replaced.ids"
cmp -s "$tmp/rep.bin" "$tmp/rep.want" || fail "--invalid-utf8 replace: ids differ from the reference"
expect_error 1 "--invalid-utf8" "$stp" tokenize --invalid-utf8 skip "$data/gpt2" "$data/invalid_utf8.txt" "$tmp/x.bin"

# Missing files.
expect_error 1 "does not exist" "$stp" tokenize "$tmp/nope" "$data/adversarial.txt" "$tmp/x.bin"
expect_error 1 "does not exist" "$stp" tokenize "$data/gpt2" "$tmp/nope.txt" "$tmp/x.bin"
mkdir "$tmp/empty"
expect_error 1 "no regular files" "$stp" tokenize "$data/gpt2" "$tmp/empty" "$tmp/x.bin"
expect_error 1 "OUTPUT" "$stp" tokenize "$data/gpt2" "$data/adversarial.txt"

# Outputs never overwrite inputs: OUTPUT naming INPUT, a tokenizer file or a file inside an input
# folder is a one-line error before anything is written, and the input keeps its bytes.
cp "$data/adversarial.txt" "$tmp/same.txt"
expect_error 1 "INPUT" "$stp" tokenize "$data/gpt2" "$tmp/same.txt" "$tmp/same.txt"
cmp -s "$tmp/same.txt" "$data/adversarial.txt" || fail "OUTPUT = INPUT changed the input"
expect_error 1 "INPUT" "$stp" tokenize "$data/gpt2" "$tmp/same.txt" "$tmp/./same.txt"
ln "$tmp/same.txt" "$tmp/hardlink.txt"
expect_error 1 "INPUT" "$stp" tokenize "$data/gpt2" "$tmp/same.txt" "$tmp/hardlink.txt"
cmp -s "$tmp/same.txt" "$data/adversarial.txt" || fail "OUTPUT = a hard link of INPUT changed the input"
cp -r "$data/gpt2" "$tmp/tok"
expect_error 1 "TOKENIZER" "$stp" tokenize "$tmp/tok" "$data/adversarial.txt" "$tmp/tok/encoder.json"
cmp -s "$tmp/tok/encoder.json" "$data/gpt2/encoder.json" || fail "OUTPUT = encoder.json changed the tokenizer"
expect_error 1 "TOKENIZER" "$stp" tokenize "$tmp/tok" "$data/adversarial.txt" "$tmp/tok/new.bin"
[ -e "$tmp/tok/new.bin" ] && fail "an output was written into the tokenizer folder"
python3 -c '
import json, sys
vocab = json.load(open(sys.argv[1]))
merges = [l for l in open(sys.argv[2], encoding="utf-8").read().split("\n")[1:] if l]
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": merges}}, open(sys.argv[3], "w"))
' "$data/gpt2/encoder.json" "$data/gpt2/vocab.bpe" "$tmp/tokenizer.json"
cp "$tmp/tokenizer.json" "$tmp/tokenizer.want"
expect_error 1 "TOKENIZER" "$stp" tokenize "$tmp/tokenizer.json" "$data/adversarial.txt" "$tmp/tokenizer.json"
cmp -s "$tmp/tokenizer.json" "$tmp/tokenizer.want" || fail "OUTPUT = tokenizer.json changed the tokenizer"
mkdir "$tmp/texts"
cp "$data/adversarial.txt" "$tmp/texts/a.txt"
expect_error 1 "inside" "$stp" tokenize "$data/gpt2" "$tmp/texts" "$tmp/texts/out.bin"
[ -e "$tmp/texts/out.bin" ] && fail "an output was written into the INPUT folder"
expect_error 1 "INPUT" "$stp" tokenize "$data/gpt2" "$tmp/texts" "$tmp/texts/a.txt"
cmp -s "$tmp/texts/a.txt" "$data/adversarial.txt" || fail "OUTPUT = a file of the INPUT folder changed it"
# A file another stp command reads (here a run's metrics.jsonl) is not replaced either.
mkdir "$tmp/run" && echo '{"step":1,"loss":2.5}' >"$tmp/run/metrics.jsonl"
expect_error 1 "metrics.jsonl" "$stp" tokenize "$data/gpt2" "$data/adversarial.txt" "$tmp/run/metrics.jsonl"
grep -q '"loss":2.5' "$tmp/run/metrics.jsonl" || fail "OUTPUT = a run's metrics.jsonl replaced it"
# The output is written whole or not at all: it appears under its name only once complete, and
# an earlier file of that name is replaced, not truncated in place.
echo "earlier" >"$tmp/replaced.bin"
"$stp" tokenize "$data/gpt2" "$data/adversarial.txt" "$tmp/replaced.bin" >/dev/null 2>"$tmp/err" ||
  fail "writing over an earlier output: $(cat "$tmp/err")"
cmp -s "$tmp/replaced.bin" "$tmp/adv.want" || fail "the earlier output was not replaced by the token file"
ls -a "$tmp" | grep -q 'tmp' && fail "a temporary file was left behind: $(ls -a "$tmp")"
# Input that is not a regular file: /dev/zero never ends, so it is refused before it is read.
expect_error 1 "character device" timeout 20 "$stp" tokenize "$data/gpt2" /dev/zero "$tmp/zero.bin"
expect_error 1 "character device" timeout 20 "$stp" tokenize /dev/zero "$data/adversarial.txt" "$tmp/zero.bin"

# Token ids are below 2^22 (docs/config.md, Token files): a larger id in tokenizer.json is an error
# naming the file and the id, raised before the vocabulary is allocated: 2^31 - 1 overflowed an
# int32, 2e9 allocated one string per id. Under a 4 GiB address-space limit, so that a reader
# that allocates for the id fails here instead of exhausting the machine.
for id in 2147483647 2000000000 4194304; do
  printf '{"model": {"type": "BPE", "vocab": {"b": 1, "a": %s}, "merges": []}}' "$id" >"$tmp/big.json"
  expect_error 1 "$id" bash -c 'ulimit -v 4194304; exec timeout 20 "$@"' _ "$stp" tokenize "$tmp/big.json" "$data/adversarial.txt" "$tmp/x.bin"
  printf '{"model": {"type": "BPE", "vocab": {"b": 1}, "merges": []}, "added_tokens": [{"id": %s, "content": "<s>"}]}' \
    "$id" >"$tmp/big.json"
  expect_error 1 "$id" bash -c 'ulimit -v 4194304; exec timeout 20 "$@"' _ "$stp" tokenize "$tmp/big.json" "$data/adversarial.txt" "$tmp/x.bin"
done
grep -q "big.json" "$tmp/err" || fail "the id error does not name the file: $(cat "$tmp/err")"

# The whole fortunes text.
fortunes=/usr/share/games/fortunes
if [ -d "$fortunes" ]; then
  mkdir "$tmp/fortunes"
  for f in "$fortunes"/*; do
    name="$(basename "$f")"
    [[ "$name" == *.* || -L "$f" || ! -f "$f" ]] || cp "$f" "$tmp/fortunes/"
  done
  if [ "$(cat $(ls -d "$tmp"/fortunes/* | LC_ALL=C sort) | sha256sum | cut -d' ' -f1)" = "$(cat "$data/fortunes.sha256")" ]; then
    "$stp" tokenize "$data/gpt2" "$tmp/fortunes" "$tmp/fortunes.bin" >"$tmp/out" 2>"$tmp/err" ||
      fail "stp tokenize fortunes: $(cat "$tmp/err")"
    gzip -dc "$data/fortunes.llmc.gz" >"$tmp/fortunes.want"
    cmp "$tmp/fortunes.bin" "$tmp/fortunes.want" || fail "fortunes: ids differ from the reference"
    cat "$tmp/out"
  else
    echo "note: $fortunes is another version than the reference's; fortunes comparison skipped"
  fi
else
  echo "note: $fortunes missing; fortunes comparison skipped"
fi

# A BPE model end to end: tokenize, train 2 steps, generate through the tokenizer.
"$stp" tokenize "$data/gpt2" "$data/adversarial.txt" "$tmp/train.bin" >/dev/null 2>"$tmp/err" ||
  fail "stp tokenize for training: $(cat "$tmp/err")"
cat >"$tmp/bpe.yaml" <<YAML
model: {arch: gpt2, n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 50257, seq_len: 16}
data: {path: $tmp/train.bin, format: llmc}
train: {steps: 2, micro_batch_size: 1, microbatches: 1}
parallel: {backend: cpu, tp: 1, pp: 1, schedule: gpipe, cpu_threads: 1}
memory: {device_budget: 64MiB}
output: {dir: $tmp/bpe-run, checkpoint_every: 0}
YAML
if "$stp" train "$tmp/bpe.yaml" >/dev/null 2>"$tmp/err"; then
  ck="$tmp/bpe-run/checkpoint-2"
  gen=("$stp" generate "$ck" --prompt "Hello world" --tokens 8 --seed 7 --tokenizer "$data/gpt2")
  "${gen[@]}" >"$tmp/gen1" 2>"$tmp/err" || fail "stp generate --tokenizer: $(cat "$tmp/err")"
  "${gen[@]}" >"$tmp/gen2" 2>/dev/null
  cmp -s "$tmp/gen1" "$tmp/gen2" || fail "stp generate --tokenizer: the same seed gave other text"
  grep -q "^Hello world" "$tmp/gen1" || fail "stp generate --tokenizer: no prompt echo: $(cat "$tmp/gen1")"
  [ "$(wc -c <"$tmp/gen1")" -gt 13 ] || fail "stp generate --tokenizer: no continuation: $(cat "$tmp/gen1")"
  expect_error 1 "--tokenizer" "$stp" generate "$ck" --prompt "Hello"
  # The same run with data.tokenizer: its checkpoint carries the tokenizer.
  if "$stp" train "$tmp/bpe.yaml" --set data.tokenizer="$data/gpt2" --set output.dir="$tmp/bpe-tok" \
    >/dev/null 2>"$tmp/err"; then
    ck="$tmp/bpe-tok/checkpoint-2"
    cmp -s "$ck/vocab.json" "$data/gpt2/encoder.json" || fail "the checkpoint's vocab.json is not encoder.json"
    cmp -s "$ck/merges.txt" "$data/gpt2/vocab.bpe" || fail "the checkpoint's merges.txt is not vocab.bpe"
    "$stp" generate "$ck" --prompt "Hello world" --tokens 8 --seed 7 >"$tmp/gen3" 2>"$tmp/err" ||
      fail "stp generate with the checkpoint's tokenizer: $(cat "$tmp/err")"
    "$stp" generate "$ck" --prompt "Hello world" --tokens 8 --seed 7 --tokenizer "$data/gpt2" >"$tmp/gen4" 2>/dev/null
    cmp -s "$tmp/gen3" "$tmp/gen4" || fail "stp generate: the checkpoint's tokenizer and --tokenizer differ"
    grep -q "^Hello world" "$tmp/gen3" || fail "stp generate without --tokenizer: no prompt echo: $(cat "$tmp/gen3")"
  else
    fail "stp train with data.tokenizer: $(cat "$tmp/err")"
  fi
else
  fail "stp train on the tokenized text: $(cat "$tmp/err")"
fi

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "tokenize: all checks passed"
