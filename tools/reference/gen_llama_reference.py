#!/usr/bin/python3
"""Writes the Llama-family reference files the C++ tests compare against (tests/models/data/).

Run with Debian's torch:  /usr/bin/python3 tools/reference/gen_llama_reference.py [OUT_DIR]
Default OUT_DIR: tests/models/data. Writes, per variant V: llama_V_ref.bin (STPREF01, the format
of tools/reference/gen_gpt2_reference.py) and llama_V_ref.safetensors (the initial parameters, stp names).

The model is written out by hand with HF LlamaForCausalLM / Qwen2ForCausalLM semantics, on HF's
own tensors (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj as nn.Linear [out, in]):
RMSNorm (x * rsqrt(mean(x^2) + eps) * w), rotate-half RoPE on q and k (inv_freq = theta^(-2i/D)),
causal attention softmax(q k^T / sqrt(D)) v where query head h reads key/value head h // (H / K),
the MLP down(silu(gate(x)) * up(x)), a final RMSNorm and an LM head (lm_head, or embed_tokens when
tied), mean token cross-entropy. Everything is float64. The parameters and gradients are written
under stp's internal names and layouts (models/llama_params.h): fused qkv_proj = [q^T | k^T | v^T],
gate_up_proj = [gate^T | up^T], o_proj and down_proj transposed.

The data is the one the C++ trainer tests feed (tests/train/llama_reference_test.cpp): a u16 token
file with token i = (i * 37 + 11) mod 64 and sequential sampling, so sequence b reads the T + 1
tokens at (b * T) mod (N - T). Step s (1-based), microbatch j (0-based) holds sequences
((s - 1) * M + j) * B .. + B - 1.

Tensors:
  config        [n_layer, n_head, n_kv_head, n_embd, intermediate_size, vocab_size, seq_len, batch,
                 microbatches, rope_theta, norm_eps, qkv_bias, tie_embeddings]
  adamw.hyper   [lr, beta1, beta2, eps, weight_decay]
  tokens, targets  (B, T): step 1, microbatch 0
  param.<name>  initial parameters (stp names and layouts)
  logits        (B, T, V) of tokens at the initial parameters;  loss (1,)
  grad.<name>   gradient of that loss
  adamw.losses  (5,) the step losses of 5 trainer steps (M microbatches of B sequences each, mean
                loss; torch.optim.AdamW, decay on tensors with >= 2 dims, constant lr, no clipping),
                each measured before that step's update

The variant "masked" (the gqa model) is the masked-loss reference (docs/config.md, Loss masks):
trained on the same tokens with the loss mask of tools/reference/gen_gpt2_reference.py
(masked_reference: its data, its loss and its tensors; targets the mask leaves out are -1),
the losses the masked mean over each step's global batch, plus final.<name> (stp names) the
parameters after the 5 updates.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_gpt2_reference import loss_mask64, masked_batch, masked_training, write, write_safetensors  # noqa: E402

LR, BETA1, BETA2, EPS, WD = 3e-3, 0.9, 0.95, 1e-8, 0.1
STEPS = 5
N_TOKENS = 4000

VARIANTS = {
    # Llama 2/3: grouped-query attention, untied head, no biases.
    "gqa": dict(n_layer=8, n_head=8, n_kv_head=4, n_embd=32, intermediate_size=48, vocab=64, seq=8, batch=2,
                microbatches=8, theta=10000.0, eps=1e-5, qkv_bias=False, tie=False),
    # Qwen2: q/k/v biases, tied head (as the small Qwen2 models), grouped-query attention.
    "qwen2": dict(n_layer=8, n_head=8, n_kv_head=4, n_embd=32, intermediate_size=48, vocab=64, seq=8, batch=2,
                  microbatches=8, theta=1000000.0, eps=1e-6, qkv_bias=True, tie=True),
    # Multi-head attention (n_kv_head = n_head), untied, with biases.
    "mha": dict(n_layer=2, n_head=4, n_kv_head=4, n_embd=32, intermediate_size=48, vocab=64, seq=8, batch=2,
                microbatches=8, theta=10000.0, eps=1e-5, qkv_bias=True, tie=False),
    # The gqa model under a loss mask.
    "masked": dict(n_layer=8, n_head=8, n_kv_head=4, n_embd=32, intermediate_size=48, vocab=64, seq=8, batch=2,
                   microbatches=8, theta=10000.0, eps=1e-5, qkv_bias=False, tie=False, mask=True),
}


def hf_params(cfg, gen):
    """HF tensors (nn.Linear weights [out, in]) with enough spread that every path matters."""
    C, H, K, I, V = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"], cfg["intermediate_size"], cfg["vocab"]
    D = C // H

    def randn(*shape, std):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    p = {"model.embed_tokens.weight": randn(V, C, std=0.1)}
    for i in range(cfg["n_layer"]):
        h = f"model.layers.{i}."
        p[h + "input_layernorm.weight"] = 1 + randn(C, std=0.1)
        p[h + "self_attn.q_proj.weight"] = randn(H * D, C, std=0.1)
        p[h + "self_attn.k_proj.weight"] = randn(K * D, C, std=0.1)
        p[h + "self_attn.v_proj.weight"] = randn(K * D, C, std=0.1)
        if cfg["qkv_bias"]:
            p[h + "self_attn.q_proj.bias"] = randn(H * D, std=0.1)
            p[h + "self_attn.k_proj.bias"] = randn(K * D, std=0.1)
            p[h + "self_attn.v_proj.bias"] = randn(K * D, std=0.1)
        p[h + "self_attn.o_proj.weight"] = randn(C, H * D, std=0.1)
        p[h + "post_attention_layernorm.weight"] = 1 + randn(C, std=0.1)
        p[h + "mlp.gate_proj.weight"] = randn(I, C, std=0.1)
        p[h + "mlp.up_proj.weight"] = randn(I, C, std=0.1)
        p[h + "mlp.down_proj.weight"] = randn(C, I, std=0.1)
    p["model.norm.weight"] = 1 + randn(C, std=0.1)
    if not cfg["tie"]:
        p["lm_head.weight"] = randn(V, C, std=0.1)
    # Round to float32 first: the C++ side starts from exactly these values.
    return {k: v.to(torch.float32).to(torch.float64).requires_grad_(True) for k, v in p.items()}


def to_stp(cfg, t):
    """HF tensors (or their gradients) -> stp's internal names and layouts (models/llama_params.h)."""
    out = {"model.embed_tokens.weight": t["model.embed_tokens.weight"]}
    for i in range(cfg["n_layer"]):
        h = f"model.layers.{i}."
        a, m = h + "self_attn.", h + "mlp."
        out[h + "input_layernorm.weight"] = t[h + "input_layernorm.weight"]
        out[a + "qkv_proj.weight"] = torch.cat([t[a + n + ".weight"].T for n in ("q_proj", "k_proj", "v_proj")], 1)
        if cfg["qkv_bias"]:
            out[a + "qkv_proj.bias"] = torch.cat([t[a + n + ".bias"] for n in ("q_proj", "k_proj", "v_proj")])
        out[a + "o_proj.weight"] = t[a + "o_proj.weight"].T
        out[h + "post_attention_layernorm.weight"] = t[h + "post_attention_layernorm.weight"]
        out[m + "gate_up_proj.weight"] = torch.cat([t[m + "gate_proj.weight"].T, t[m + "up_proj.weight"].T], 1)
        out[m + "down_proj.weight"] = t[m + "down_proj.weight"].T
    out["model.norm.weight"] = t["model.norm.weight"]
    if not cfg["tie"]:
        out["lm_head.weight"] = t["lm_head.weight"]
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


def forward(cfg, p, tokens, targets):
    B, T = tokens.shape
    C, H, K, eps = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"], cfg["eps"]
    D = C // H
    inv_freq = 1.0 / (cfg["theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()  # (T, D)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    x = p["model.embed_tokens.weight"][tokens]
    for i in range(cfg["n_layer"]):
        h = f"model.layers.{i}."
        a = h + "self_attn."

        def proj(name, inp):
            y = inp @ p[a + name + ".weight"].T
            return y + p[a + name + ".bias"] if cfg["qkv_bias"] else y

        n = rms_norm(x, p[h + "input_layernorm.weight"], eps)
        q = proj("q_proj", n).view(B, T, H, D).transpose(1, 2)
        k = proj("k_proj", n).view(B, T, K, D).transpose(1, 2)
        v = proj("v_proj", n).view(B, T, K, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // K, dim=1)  # query head h reads kv head h // (H / K)
        v = v.repeat_interleave(H // K, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * D)
        x = x + y @ p[a + "o_proj.weight"].T
        n = rms_norm(x, p[h + "post_attention_layernorm.weight"], eps)
        m = h + "mlp."
        g = F.silu(n @ p[m + "gate_proj.weight"].T) * (n @ p[m + "up_proj.weight"].T)
        x = x + g @ p[m + "down_proj.weight"].T
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg["tie"] else p["lm_head.weight"]
    logits = x @ head.T
    loss = F.cross_entropy(logits.reshape(-1, cfg["vocab"]), targets.reshape(-1), ignore_index=-1)
    return logits, loss


def token_file():
    return torch.tensor([(i * 37 + 11) % 64 for i in range(N_TOKENS)], dtype=torch.int64)


def batch(cfg, data, step, micro):
    B, T, M = cfg["batch"], cfg["seq"], cfg["microbatches"]
    rows = []
    for r in range(B):
        b = ((step - 1) * M + micro) * B + r
        off = (b * T) % (N_TOKENS - T)
        rows.append(data[off:off + T + 1])
    rows = torch.stack(rows)
    return rows[:, :-1], rows[:, 1:]


def generate(name, cfg, out_dir):
    gen = torch.Generator().manual_seed(20250207 + len(name))
    p = hf_params(cfg, gen)
    data = token_file()
    masked = cfg.get("mask", False)
    mask = loss_mask64()

    def step_batch(step, micro):
        if masked:
            return masked_batch(data, mask, cfg["batch"], cfg["seq"], cfg["microbatches"], step, micro)
        return batch(cfg, data, step, micro)

    tokens, targets = step_batch(1, 0)
    config = [cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"], cfg["n_embd"], cfg["intermediate_size"], cfg["vocab"],
              cfg["seq"], cfg["batch"], cfg["microbatches"], cfg["theta"], cfg["eps"], float(cfg["qkv_bias"]),
              float(cfg["tie"])]
    tensors = [("config", torch.tensor(config, dtype=torch.float64)),
               ("adamw.hyper", torch.tensor([LR, BETA1, BETA2, EPS, WD], dtype=torch.float64)),
               ("tokens", tokens.double()), ("targets", targets.double())]
    stp_params = to_stp(cfg, p)
    tensors += [("param." + k, v) for k, v in stp_params.items()]
    base = os.path.join(out_dir, f"llama_{name}_ref")
    write_safetensors(base + ".safetensors", list(stp_params.items()))
    logits, loss = forward(cfg, p, tokens, targets)
    loss.backward()
    tensors += [("logits", logits), ("loss", loss.reshape(1))]
    grads = to_stp(cfg, {k: v.grad for k, v in p.items()})
    tensors += [("grad." + k, v) for k, v in grads.items()]

    if masked:
        losses = masked_training(p, lambda s: [step_batch(s, j) for j in range(cfg["microbatches"])], STEPS,
                                 lambda tk, tg: forward(cfg, p, tk, tg))
        tensors.append(("adamw.losses", torch.tensor(losses, dtype=torch.float64)))
        tensors += [("final." + k, v) for k, v in to_stp(cfg, p).items()]
        write(base + ".bin", tensors)
        print(f"wrote {base}.bin: masked loss {loss.item():.6f}, step losses {', '.join(f'{v:.6f}' for v in losses)}")
        return
    decay = [v for v in p.values() if v.dim() >= 2]
    no_decay = [v for v in p.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for step in range(1, STEPS + 1):
        opt.zero_grad()
        total = 0.0
        for micro in range(cfg["microbatches"]):
            tk, tg = batch(cfg, data, step, micro)
            _, l = forward(cfg, p, tk, tg)
            (l / cfg["microbatches"]).backward()
            total += l.item()
        losses.append(total / cfg["microbatches"])
        opt.step()
    tensors.append(("adamw.losses", torch.tensor(losses, dtype=torch.float64)))
    write(base + ".bin", tensors)
    print(f"wrote {base}.bin: loss {loss.item():.6f}, step losses {', '.join(f'{v:.6f}' for v in losses)}")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/models/data"
    for name, cfg in VARIANTS.items():
        generate(name, cfg, out_dir)


if __name__ == "__main__":
    main()
