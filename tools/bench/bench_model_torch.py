#!/usr/bin/python3
"""PyTorch side of tools/bench/bench_model.cpp: the same GPT-2 (HF semantics, float32, tied head) or
Llama (HF LlamaForCausalLM semantics: RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU,
untied head), one training step = forward + backward + AdamW, on 2 threads. Prints
"torch step S s  tokens_per_s X".

  /usr/bin/python3 tools/bench/bench_model_torch.py [--arch gpt2 --layers 6 --heads 6 --embd 384 --seq 256
                                               --batch 8 --vocab 50257 --steps 3]
  /usr/bin/python3 tools/bench/bench_model_torch.py --arch llama --kv-heads 2 --inter 1024 --vocab 32000 ...
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F


def make_params(L, C, V, T):
    g = torch.Generator().manual_seed(1234)
    def n(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).requires_grad_(True)
    def const(v, *shape):
        return torch.full(shape, float(v)).requires_grad_(True)
    p = {"wte": n(V, C), "wpe": n(T, C), "ln_f.w": const(1, C), "ln_f.b": const(0, C)}
    for i in range(L):
        h = f"h{i}."
        p.update({h + "ln1.w": const(1, C), h + "ln1.b": const(0, C), h + "attn.w": n(C, 3 * C),
                  h + "attn.b": const(0, 3 * C), h + "proj.w": n(C, C, std=0.02 / math.sqrt(2 * L)),
                  h + "proj.b": const(0, C), h + "ln2.w": const(1, C), h + "ln2.b": const(0, C),
                  h + "fc.w": n(C, 4 * C), h + "fc.b": const(0, 4 * C),
                  h + "fc2.w": n(4 * C, C, std=0.02 / math.sqrt(2 * L)), h + "fc2.b": const(0, C)})
    return p


def forward(p, tokens, targets, L, nh):
    B, T = tokens.shape
    C = p["wte"].shape[1]
    hd = C // nh
    x = p["wte"][tokens] + p["wpe"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        h = f"h{i}."
        a = F.layer_norm(x, (C,), p[h + "ln1.w"], p[h + "ln1.b"], 1e-5)
        qkv = torch.addmm(p[h + "attn.b"], a.view(-1, C), p[h + "attn.w"]).view(B, T, 3 * C)
        q, k, v = (t.view(B, T, nh, hd).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B * T, C)
        x = x + torch.addmm(p[h + "proj.b"], y, p[h + "proj.w"]).view(B, T, C)
        m = F.layer_norm(x, (C,), p[h + "ln2.w"], p[h + "ln2.b"], 1e-5).view(-1, C)
        m = F.gelu(torch.addmm(p[h + "fc.b"], m, p[h + "fc.w"]), approximate="tanh")
        x = x + torch.addmm(p[h + "fc2.b"], m, p[h + "fc2.w"]).view(B, T, C)
    x = F.layer_norm(x, (C,), p["ln_f.w"], p["ln_f.b"], 1e-5)
    logits = x.view(-1, C) @ p["wte"].t()
    return F.cross_entropy(logits, targets.reshape(-1))


def make_llama_params(L, C, V, nh, nkv, inter):
    g = torch.Generator().manual_seed(1234)
    def n(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).requires_grad_(True)
    def ones(*shape):
        return torch.ones(*shape).requires_grad_(True)
    hd = C // nh
    p = {"embed": n(V, C), "norm": ones(C), "head": n(V, C)}
    for i in range(L):
        h = f"h{i}."
        p.update({h + "ln1": ones(C), h + "qkv": n(C, (nh + 2 * nkv) * hd), h + "o": n(nh * hd, C),
                  h + "ln2": ones(C), h + "gate_up": n(C, 2 * inter), h + "down": n(inter, C)})
    return p


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):  # x (B, H, T, D), rotate-half
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def llama_forward(p, tokens, targets, L, nh, nkv, theta=10000.0):
    B, T = tokens.shape
    C = p["embed"].shape[1]
    hd = C // nh
    inv = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
    ang = torch.outer(torch.arange(T).float(), inv)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    x = p["embed"][tokens]
    for i in range(L):
        h = f"h{i}."
        a = rms_norm(x, p[h + "ln1"]).view(-1, C)
        qkv = (a @ p[h + "qkv"]).view(B, T, -1)
        q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=2)
        q = rope(q.view(B, T, nh, hd).transpose(1, 2), cos, sin)
        k = rope(k.view(B, T, nkv, hd).transpose(1, 2), cos, sin)
        v = v.view(B, T, nkv, hd).transpose(1, 2)
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B * T, nh * hd)
        x = x + (y @ p[h + "o"]).view(B, T, C)
        m = rms_norm(x, p[h + "ln2"]).view(-1, C) @ p[h + "gate_up"]
        gate, up = m.chunk(2, dim=-1)
        x = x + ((F.silu(gate) * up) @ p[h + "down"]).view(B, T, C)
    x = rms_norm(x, p["norm"])
    logits = x.view(-1, C) @ p["head"].t()
    return F.cross_entropy(logits, targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(layers=6, heads=6, embd=384, seq=256, batch=8, vocab=50257, steps=3, kv_heads=2,
                     inter=1024).items():
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    ap.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    a = ap.parse_args()
    torch.set_num_threads(2)
    if a.arch == "llama":
        p = make_llama_params(a.layers, a.embd, a.vocab, a.heads, a.kv_heads, a.inter)
    else:
        p = make_params(a.layers, a.embd, a.vocab, a.seq)
    params = list(p.values())
    decay = [t for t in params if t.dim() >= 2]
    no_decay = [t for t in params if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(7)
    data = torch.randint(0, a.vocab, (a.batch * a.seq + 1,), generator=g)
    tokens, targets = data[:-1].view(a.batch, a.seq), data[1:].view(a.batch, a.seq)

    def step():
        opt.zero_grad(set_to_none=True)
        if a.arch == "llama":
            loss = llama_forward(p, tokens, targets, a.layers, a.heads, a.kv_heads)
        else:
            loss = forward(p, tokens, targets, a.layers, a.heads)
        loss.backward()
        opt.step()

    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = (time.perf_counter() - t0) / a.steps
    print(f"torch step {dt:.3f} s  tokens_per_s {a.batch * a.seq / dt:.1f}")


if __name__ == "__main__":
    main()
