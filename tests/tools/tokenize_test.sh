#!/usr/bin/env bash
# CTest: tools.tokenize_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# `stp tokenize` end to end with GPT-2's vocabulary (tests/data/tokenizer/):
#   * the fortunes text (the Debian fortunes package's text files, each encoded alone, in name
#     order, --eot none) gives byte for byte the llm.c file of the gpt-3-encoder reference
#     (fortunes.llmc.gz), also when read in chunks of 1000 bytes; skipped when the package is
#     missing or another version (fortunes.sha256);
#   * documents: a folder's files with <|endoftext|> between them; JSONL text; shards whose
#     payloads concatenate to the single file, stale shards removed; prompt/completion records
#     with the mask file's exact bytes; JSONL errors naming the file and line; --eot errors; a
#     shard name that is an input is refused;
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

# payload FILE: the ids of an llmc file, one per line.
payload() { python3 -c '
import struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack_from("<i", b, 8)[0]
assert len(b) == 1024 + 2 * n, (sys.argv[1], len(b), n)
print("\n".join(str(x) for x in struct.unpack_from("<%dH" % n, b, 1024)))
' "$1"; }

# Documents: a folder's files are separated by <|endoftext|> (50256), --eot none joins them.
mkdir "$tmp/docs"
printf 'Hello world\n' >"$tmp/docs/a.txt"
printf 'Hi there.' >"$tmp/docs/b.txt"
"$stp" tokenize "$data/gpt2" "$tmp/docs/a.txt" "$tmp/a.bin" >/dev/null 2>&1 || fail "tokenize a.txt"
"$stp" tokenize "$data/gpt2" "$tmp/docs/b.txt" "$tmp/b.bin" >/dev/null 2>&1 || fail "tokenize b.txt"
"$stp" tokenize "$data/gpt2" "$tmp/docs" "$tmp/ab.bin" >/dev/null 2>"$tmp/err" || fail "tokenize docs/: $(cat "$tmp/err")"
[ "$(payload "$tmp/ab.bin")" = "$(payload "$tmp/a.bin"; echo 50256; payload "$tmp/b.bin")" ] ||
  fail "a folder's documents are not separated by <|endoftext|>: $(payload "$tmp/ab.bin" | tr '\n' ' ')"
"$stp" tokenize --eot '<|endoftext|>' "$data/gpt2" "$tmp/docs" "$tmp/ab2.bin" >/dev/null 2>&1
cmp -s "$tmp/ab.bin" "$tmp/ab2.bin" || fail "--eot '<|endoftext|>' differs from the default"
"$stp" tokenize --eot 13 "$data/gpt2" "$tmp/docs" "$tmp/ab3.bin" >/dev/null 2>&1
[ "$(payload "$tmp/ab3.bin" | sed -n 4p)" = 13 ] || fail "--eot 13 is not the separator: $(payload "$tmp/ab3.bin" | tr '\n' ' ')"
"$stp" tokenize --eot none "$data/gpt2" "$tmp/docs" "$tmp/ab4.bin" >/dev/null 2>&1
[ "$(payload "$tmp/ab4.bin")" = "$(payload "$tmp/a.bin"; payload "$tmp/b.bin")" ] || fail "--eot none separates documents"
expect_error 1 "--eot" "$stp" tokenize --eot 50257 "$data/gpt2" "$tmp/docs" "$tmp/x.bin"
expect_error 1 "<|nope|>" "$stp" tokenize --eot '<|nope|>' "$data/gpt2" "$tmp/docs" "$tmp/x.bin"
expect_error 1 "--jsonl" "$stp" tokenize --prompt-field p --completion-field c "$data/gpt2" "$tmp/docs" "$tmp/x.bin"

# The adversarial text in chunks of 7 bytes gives the same file.
"$stp" tokenize --chunk-bytes 7 "$data/gpt2" "$data/adversarial.txt" "$tmp/adv7.bin" >/dev/null 2>&1
cmp -s "$tmp/adv7.bin" "$tmp/adv.want" || fail "--chunk-bytes 7: ids differ from the reference"

# Shards: their payloads in name order are the single file's; fewer shards later remove the rest.
"$stp" tokenize --shard-tokens 1000 "$data/gpt2" "$data/adversarial.txt" "$tmp/sh.bin" >"$tmp/out" 2>"$tmp/err" ||
  fail "--shard-tokens: $(cat "$tmp/err")"
n_shards="$(ls "$tmp"/sh_*.bin | wc -l)"
[ "$n_shards" -ge 2 ] || fail "--shard-tokens 1000 wrote $n_shards shard(s)"
[ "$(for f in "$tmp"/sh_*.bin; do payload "$f"; done)" = "$(payload "$tmp/adv.want")" ] ||
  fail "the shards do not concatenate to the single file"
[ "$(payload "$tmp/sh_000000.bin" | wc -l)" -eq 1000 ] || fail "shard 0 does not hold 1000 tokens"
grep -q "sh_000000.bin" "$tmp/out" || fail "the summary does not name the shards: $(cat "$tmp/out")"
"$stp" tokenize --shard-tokens 100000 "$data/gpt2" "$data/adversarial.txt" "$tmp/sh.bin" >"$tmp/out" 2>&1
[ "$(ls "$tmp"/sh_*.bin)" = "$tmp/sh_000000.bin" ] || fail "stale shards were left: $(ls "$tmp"/sh_*.bin)"
grep -q "removed .*sh_000001.bin" "$tmp/out" || fail "the removal of stale shards is not reported: $(cat "$tmp/out")"
cmp -s "$tmp/sh_000000.bin" "$tmp/adv.want" || fail "one shard differs from the single file"
# A shard's name that is an input is refused before anything is written.
printf 'Hello' >"$tmp/in_000000.txt"
expect_error 1 "INPUT" "$stp" tokenize --shard-tokens 10 "$data/gpt2" "$tmp/in_000000.txt" "$tmp/in.txt"
[ "$(cat "$tmp/in_000000.txt")" = Hello ] || fail "a shard overwrote its input"

# JSONL text: documents separated by <|endoftext|>, blank lines skipped, --text-field.
printf '{"text": "Hello world\\n"}\n\n{"text": "Hi there.", "id": 2}\n' >"$tmp/t.jsonl"
"$stp" tokenize --jsonl "$data/gpt2" "$tmp/t.jsonl" "$tmp/t.bin" >/dev/null 2>"$tmp/err" || fail "--jsonl: $(cat "$tmp/err")"
cmp -s "$tmp/t.bin" "$tmp/ab.bin" || fail "--jsonl text differs from the same documents as files"
printf '{"body": "Hello world\\n"}\n{"body": "Hi there."}' >"$tmp/body.jsonl"
"$stp" tokenize --jsonl --text-field body "$data/gpt2" "$tmp/body.jsonl" "$tmp/body.bin" >/dev/null 2>&1
cmp -s "$tmp/body.bin" "$tmp/ab.bin" || fail "--text-field body differs"
# Errors name the file and the line, and write nothing.
printf '{"text": "a"}\n{"text": "b",}\n' >"$tmp/bad.jsonl"
expect_error 1 "bad.jsonl' line 2: invalid JSON" "$stp" tokenize --jsonl "$data/gpt2" "$tmp/bad.jsonl" "$tmp/bad.bin"
printf '{"text": "a"}\n{"txt": "b"}\n' >"$tmp/bad.jsonl"
expect_error 1 "line 2: no field \"text\"" "$stp" tokenize --jsonl "$data/gpt2" "$tmp/bad.jsonl" "$tmp/bad.bin"
printf '{"text": ["a"]}\n' >"$tmp/bad.jsonl"
expect_error 1 "line 1: field \"text\" is an array" "$stp" tokenize --jsonl "$data/gpt2" "$tmp/bad.jsonl" "$tmp/bad.bin"
[ -e "$tmp/bad.bin" ] && fail "an output was written despite a JSONL error"

# Prompt/completion: tokens and the mask file, byte for byte.
printf '{"prompt": "Hello", "completion": " world"}\n{"prompt": "Hi", "completion": " there"}\n' >"$tmp/pc.jsonl"
"$stp" tokenize --jsonl --prompt-field prompt --completion-field completion "$data/gpt2" "$tmp/pc.jsonl" "$tmp/pc.bin" \
  >"$tmp/out" 2>"$tmp/err" || fail "prompt/completion: $(cat "$tmp/err")"
printf '15496\n995\n50256\n17250\n612\n50256\n' | llmc "$tmp/pc.want"
cmp -s "$tmp/pc.bin" "$tmp/pc.want" || fail "prompt/completion ids: $(payload "$tmp/pc.bin" | tr '\n' ' ')"
python3 -c '
import struct, sys
want = b"STPMASK1" + struct.pack("<IIQQ", 1, 0, 6, 0) + bytes([0, 1, 1, 0, 1, 1])
sys.exit(0 if open(sys.argv[1], "rb").read() == want else 1)
' "$tmp/pc.bin.mask" || fail "the mask file's bytes: $(od -An -tx1 "$tmp/pc.bin.mask" | tr -s ' \n' ' ')"
grep -q "4 of 6 tokens counted" "$tmp/out" || fail "the summary does not count the targets: $(cat "$tmp/out")"
# A chat with GPT-2's tokenizer (no ChatML tokens): the plain template; the assistant's one-token
# content and the end-of-text token after it are the 2 targets.
printf '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}\n' >"$tmp/chat.jsonl"
"$stp" tokenize --jsonl --messages-field messages "$data/gpt2" "$tmp/chat.jsonl" "$tmp/chat.bin" >"$tmp/out" 2>"$tmp/err" ||
  fail "--messages-field: $(cat "$tmp/err")"
grep -q "chat template: plain" "$tmp/out" || fail "the chat template is not named: $(cat "$tmp/out")"
grep -q " 2 of [0-9]* tokens counted" "$tmp/out" || fail "--messages-field: the targets: $(cat "$tmp/out")"
[ -f "$tmp/chat.bin.mask" ] || fail "--messages-field wrote no mask"
expect_error 1 "--eot none" "$stp" tokenize --eot none --jsonl --prompt-field prompt --completion-field completion \
  "$data/gpt2" "$tmp/pc.jsonl" "$tmp/x.bin"
expect_error 1 "line 1: no field \"answer\"" "$stp" tokenize --jsonl --prompt-field prompt --completion-field answer \
  "$data/gpt2" "$tmp/pc.jsonl" "$tmp/x.bin"

# The whole fortunes text.
fortunes=/usr/share/games/fortunes
if [ -d "$fortunes" ]; then
  mkdir "$tmp/fortunes"
  for f in "$fortunes"/*; do
    name="$(basename "$f")"
    [[ "$name" == *.* || -L "$f" || ! -f "$f" ]] || cp "$f" "$tmp/fortunes/"
  done
  if [ "$(cat $(ls -d "$tmp"/fortunes/* | LC_ALL=C sort) | sha256sum | cut -d' ' -f1)" = "$(cat "$data/fortunes.sha256")" ]; then
    "$stp" tokenize --eot none "$data/gpt2" "$tmp/fortunes" "$tmp/fortunes.bin" >"$tmp/out" 2>"$tmp/err" ||
      fail "stp tokenize fortunes: $(cat "$tmp/err")"
    gzip -dc "$data/fortunes.llmc.gz" >"$tmp/fortunes.want"
    cmp "$tmp/fortunes.bin" "$tmp/fortunes.want" || fail "fortunes: ids differ from the reference"
    cat "$tmp/out"
    "$stp" tokenize --eot none --chunk-bytes 1000 "$data/gpt2" "$tmp/fortunes" "$tmp/fortunes.1000.bin" >/dev/null \
      2>"$tmp/err" || fail "stp tokenize fortunes --chunk-bytes 1000: $(cat "$tmp/err")"
    cmp "$tmp/fortunes.1000.bin" "$tmp/fortunes.want" || fail "fortunes in chunks of 1000 bytes: ids differ"
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
