#!/usr/bin/python3
"""PyTorch side of tools/bench_model.cpp: the same GPT-2 (HF semantics, float32, tied head), one
training step = forward + backward + AdamW, on 2 threads. Prints "torch step S s  tokens_per_s X".

  /usr/bin/python3 tools/bench_model_torch.py [--layers 6 --heads 6 --embd 384 --seq 256 --batch 8
                                               --vocab 50257 --steps 3]
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


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(layers=6, heads=6, embd=384, seq=256, batch=8, vocab=50257, steps=3).items():
        ap.add_argument("--" + k, type=int, default=v)
    a = ap.parse_args()
    torch.set_num_threads(2)
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
