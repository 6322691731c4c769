#!/usr/bin/env python3
"""stp <-> Hugging Face transformers, end to end, on a machine that has transformers.

The project's own tests check the Hugging Face folder format against committed reference files
(tests/models, tests/formats); this script checks it against transformers itself, which Debian
does not package. For each architecture stp exports -- gpt2; llama with grouped-query attention,
an untied head and rope_theta 500000; qwen2 with q/k/v biases, a tied head and rope_theta 1e6 --
it:

  1. trains a tiny model with stp (tp 1, pp 1, byte-level text) for --steps steps;
  2. loads the checkpoint folder with transformers' AutoModelForCausalLM: the class named by
     config.json, no missing, unexpected or mismatched tensors, no warning from transformers;
  3. compares the loss on one held-out sequence of seq_len + 1 bytes: stp's validation loss (one
     step at lr 0, weights unchanged) against transformers in float64, relative difference < 2e-6;
  4. compares greedy continuations: `stp generate --temperature 0` against transformers'
     generate(do_sample=False), byte for byte;
  5. has transformers save the model again as bf16 shards (save_pretrained, small max_shard_size:
     model.safetensors.index.json, its own config.json), imports that folder into stp
     (model.init_from) and compares stp's validation loss with transformers' float64 loss of the
     bf16 weights, relative difference < 2e-6.
Then, for the tokenizer a checkpoint carries: a gpt2 trained on text tokenized with GPT-2's
vocabulary (tests/data/tokenizer/gpt2, data.tokenizer) writes a checkpoint that transformers'
AutoTokenizer loads alone, with GPT-2's 50257 ids and GPT-2's ids for a known text.

Prints one line per check and "ALL OK" or "FAILED"; exit status 0 only when every check passed.

Usage: tools/reference/hf_interop_check.py [--stp build/stp] [--work DIR] [--steps N] [--data PATH]
Run from the repository root (it reads configs/tiny.yaml and configs/llama-tiny.yaml).
"""
import argparse
import json
import logging
import os
import shutil
import subprocess
import sys

MODELS = {
    "gpt2": ("configs/tiny.yaml", []),
    "llama": ("configs/llama-tiny.yaml", ["model.rope_theta=500000"]),
    "qwen2": ("configs/llama-tiny.yaml",
              ["model.qkv_bias=true", "model.tie_embeddings=true", "model.rope_theta=1000000"]),
}
PROMPT = b"The meaning of life is "
NEW_TOKENS = 80
REL_TOL = 2e-6  # f32 forward of a 4-layer model against float64: measured 2.2e-10 .. 3.1e-7


def stp(args, *argv):
    r = subprocess.run([args.stp, *argv], capture_output=True)
    if r.returncode != 0:
        raise RuntimeError("stp %s failed (%d):\n%s" % (argv[0], r.returncode, r.stderr.decode(errors="replace")[-2000:]))
    return r.stdout


def sets(pairs):
    return [x for p in pairs for x in ("--set", p)]


def stp_val_loss(args, name, init_from, val_path):
    cfg, extra = MODELS[name]
    out = os.path.join(args.work, "eval_" + name + "_" + os.path.basename(init_from.rstrip("/")))
    shutil.rmtree(out, ignore_errors=True)
    # A model key given in the YAML must agree with an imported config.json; the ones stp's
    # exported folder carries agree, transformers' re-saved folder too (same model).
    stp(args, "train", cfg, *sets(["parallel.tp=1", "parallel.pp=1", "parallel.schedule=gpipe", "train.steps=1",
                                   "train.lr=0", "train.min_lr=0", "train.warmup_steps=0", "data.path=" + args.data,
                                   "data.val_path=" + val_path, "train.eval_every=1", "train.eval_batches=1",
                                   "train.micro_batch_size=1", "train.microbatches=1", "model.init_from=" + init_from,
                                   "output.dir=" + out] + extra))
    for line in open(os.path.join(out, "metrics.jsonl")):
        j = json.loads(line)
        if j.get("val_loss") is not None:
            return j["val_loss"]
    raise RuntimeError("no val_loss in " + out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stp", default="build/stp")
    ap.add_argument("--work", default="runs/hf-interop")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    args = ap.parse_args()
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        print("hf_interop_check: error: needs torch and transformers (%s)" % e, file=sys.stderr)
        return 2
    print("transformers", transformers.__version__, "torch", torch.__version__)
    warnings = []

    class Keep(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    transformers.logging.get_logger("transformers").addHandler(Keep(level=logging.WARNING))
    os.makedirs(args.work, exist_ok=True)
    failures = []

    def check(ok, what):
        print(("  ok    " if ok else "  FAIL  ") + what)
        if not ok:
            failures.append(what)

    def hf_loss(path, ids):
        m, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, dtype=torch.float64)
        m.eval()
        with torch.no_grad():
            logits = m(ids[:, :-1]).logits[0]  # predictions of positions 1 .. T, as stp's validation loss
            loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:]).item()
        return m, info, loss

    for name, (cfg, extra) in MODELS.items():
        print("==", name)
        run = os.path.join(args.work, name)
        shutil.rmtree(run, ignore_errors=True)
        stp(args, "train", cfg, *sets(["parallel.tp=1", "parallel.pp=1", "train.steps=%d" % args.steps,
                                       "train.warmup_steps=5", "output.log_every=%d" % args.steps,
                                       "data.path=" + args.data, "output.dir=" + run] + extra))
        ckpt = os.path.join(run, "checkpoint-%d" % args.steps)
        hf_cfg = json.load(open(os.path.join(ckpt, "config.json")))
        seq_len = hf_cfg.get("n_positions") or hf_cfg["max_position_embeddings"]
        src = args.data if os.path.isfile(args.data) else os.path.join(args.data, sorted(
            f for f in os.listdir(args.data) if not f.endswith(".dat") and not f.startswith("."))[0])
        text = open(src, "rb").read()[1000:1000 + seq_len + 1]
        val_path = os.path.join(args.work, name + "_val.txt")
        open(val_path, "wb").write(text)
        ids = torch.tensor([list(text)])

        del warnings[:]
        m, info, loss = hf_loss(ckpt, ids)
        check(type(m).__name__ == hf_cfg["architectures"][0],
              "transformers loads the checkpoint as %s" % type(m).__name__)
        check(all(len(v) == 0 for v in info.values()),
              "no missing, unexpected or mismatched tensors: %s" % {k: list(v) for k, v in info.items()})
        check(not warnings, "no warning from transformers%s" % ("" if not warnings else ": " + " | ".join(warnings)))
        s = stp_val_loss(args, name, ckpt, val_path)
        rel = abs(loss - s) / abs(s)
        check(rel < REL_TOL, "loss on %d held-out bytes: stp %.6f, transformers float64 %.9f, relative %.1e" %
              (len(text), s, loss, rel))

        stp_text = stp(args, "generate", ckpt, "--prompt", PROMPT.decode(), "--tokens", str(NEW_TOKENS),
                       "--temperature", "0")
        prompt = torch.tensor([list(PROMPT)])
        with torch.no_grad():
            out = m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                             do_sample=False)
        hf_text = bytes(out[0].tolist())
        check(stp_text[:len(hf_text)] == hf_text and len(hf_text) == len(PROMPT) + NEW_TOKENS,
              "greedy %d tokens: stp generate and transformers generate agree byte for byte" % NEW_TOKENS)

        hf_dir = os.path.join(args.work, name + "_hf_bf16")
        shutil.rmtree(hf_dir, ignore_errors=True)
        m.to(torch.bfloat16).save_pretrained(hf_dir, max_shard_size="300KB")
        shards = [f for f in os.listdir(hf_dir) if f.endswith(".safetensors")]
        print("  transformers wrote %d bf16 shards and %s" % (len(shards), sorted(set(os.listdir(hf_dir)) - set(shards))))
        _, _, loss16 = hf_loss(hf_dir, ids)
        s16 = stp_val_loss(args, name, hf_dir, val_path)
        rel = abs(loss16 - s16) / abs(s16)
        check(rel < REL_TOL, "transformers' bf16 shards imported by stp: loss stp %.6f, transformers float64 %.9f, "
              "relative %.1e" % (s16, loss16, rel))
    print("== gpt2 with its tokenizer")
    from transformers import AutoTokenizer
    gpt2_tok = "tests/data/tokenizer/gpt2"
    sample = os.path.join(args.work, "bpe_sample.txt")
    open(sample, "wb").write(open(src, "rb").read()[:20000])
    tokens = os.path.join(args.work, "bpe_sample.bin")
    stp(args, "tokenize", gpt2_tok, sample, tokens)
    run = os.path.join(args.work, "gpt2_bpe")
    shutil.rmtree(run, ignore_errors=True)
    stp(args, "train", "configs/tiny.yaml", *sets(["parallel.tp=1", "parallel.pp=1", "train.steps=1",
                                                   "model.vocab_size=50257", "data.format=llmc",
                                                   "data.path=" + tokens, "data.tokenizer=" + gpt2_tok,
                                                   "output.dir=" + run]))
    ckpt = os.path.join(run, "checkpoint-1")
    tok = AutoTokenizer.from_pretrained(ckpt)
    check(len(tok) == 50257, "AutoTokenizer loads the checkpoint's tokenizer alone (%s, %d ids)" %
          (type(tok).__name__, len(tok)))
    check(tok("Hello world")["input_ids"] == [15496, 995], "it encodes 'Hello world' as GPT-2 does: %s" %
          tok("Hello world")["input_ids"])
    print("ALL OK" if not failures else "FAILED: %d check(s)" % len(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
