#!/usr/bin/python3
"""Writes the GPT-2 reference file the C++ model tests compare against (tests/models/data/).

Run with Debian's torch:  /usr/bin/python3 tools/reference/gen_gpt2_reference.py [OUT]
Default OUT: tests/models/data/gpt2_tiny_ref.bin

The model is written out by hand with HF GPT-2 semantics (learned positions, pre-LayerNorm with
eps 1e-5, causal attention, tanh GELU, final LayerNorm, LM head tied to wte, mean token
cross-entropy, no dropout) and HF tensor names/layouts (Conv1D weights are [in, out]). Everything
is computed in float64, so the file holds the exact answer rounded to float32 and the C++ float32
results are compared against truth, not against another float32 summation order.

File format (little endian), "STPREF01":
  8 bytes magic "STPREF01", u32 tensor count, then per tensor:
  u32 name length, name bytes (UTF-8), u32 ndim, ndim x i64 dims, prod(dims) x f32 values.
Tensors:
  config               [n_layer, n_head, n_embd, vocab_size, seq_len, batch]
  adamw.hyper          [lr, beta1, beta2, eps, weight_decay]
  tokens, targets      (B, T) token ids as floats (exact below 2^24)
  param.<hf name>      initial parameters, full HF shapes
  logits               (B, T, V) at the initial parameters
  loss                 (1,)
  grad.<hf name>       gradient of the loss at the initial parameters
  adamw.losses         (10,) loss of steps 1..10, each measured before that step's AdamW update
                       (torch.optim.AdamW, decay on tensors with >= 2 dims, same batch each step)

It also writes gpt2_masked_ref.bin / .safetensors beside OUT: the masked-loss reference (a loss
mask leaves some targets out of the loss and its mean; docs/config.md, Loss masks), for a 4-layer
model trained by the C++ trainer tests (tests/train/loss_mask_test.cpp) on the data those tests
write, described in masked_reference() below.
"""
import math
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

N_LAYER, N_HEAD, N_EMBD, VOCAB, SEQ, BATCH = 2, 4, 32, 64, 16, 2
LR, BETA1, BETA2, EPS, WD = 3e-3, 0.9, 0.95, 1e-8, 0.1
STEPS = 10


def make_params(gen, n_layer=N_LAYER, seq=SEQ):
    C = N_EMBD
    def randn(*shape, std):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std)
    p = {"wte.weight": randn(VOCAB, C, std=0.02 * 5), "wpe.weight": randn(seq, C, std=0.02 * 5)}
    for i in range(n_layer):
        h = f"h.{i}."
        # Non-trivial LayerNorm affine and biases so that every gradient path is exercised.
        p[h + "ln_1.weight"] = 1 + randn(C, std=0.1)
        p[h + "ln_1.bias"] = randn(C, std=0.1)
        p[h + "attn.c_attn.weight"] = randn(C, 3 * C, std=0.1)
        p[h + "attn.c_attn.bias"] = randn(3 * C, std=0.05)
        p[h + "attn.c_proj.weight"] = randn(C, C, std=0.1)
        p[h + "attn.c_proj.bias"] = randn(C, std=0.05)
        p[h + "ln_2.weight"] = 1 + randn(C, std=0.1)
        p[h + "ln_2.bias"] = randn(C, std=0.1)
        p[h + "mlp.c_fc.weight"] = randn(C, 4 * C, std=0.1)
        p[h + "mlp.c_fc.bias"] = randn(4 * C, std=0.05)
        p[h + "mlp.c_proj.weight"] = randn(4 * C, C, std=0.05)
        p[h + "mlp.c_proj.bias"] = randn(C, std=0.05)
    p["ln_f.weight"] = 1 + randn(C, std=0.1)
    p["ln_f.bias"] = randn(C, std=0.1)
    return p


def forward(p, tokens, targets, n_layer=N_LAYER):
    """Logits and the mean token cross-entropy over the targets that are not -1 (all of them in
    the unmasked reference)."""
    B, T = tokens.shape
    C, nh = N_EMBD, N_HEAD
    hd = C // nh
    x = p["wte.weight"][tokens] + p["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(n_layer):
        h = f"h.{i}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, nh, hd).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        m = F.gelu(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = x @ p["wte.weight"].t()
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-1)
    return logits, loss


def write(path, tensors):
    with open(path, "wb") as f:
        f.write(b"STPREF01")
        f.write(struct.pack("<I", len(tensors)))
        for name, t in tensors:
            t = t.detach().to(torch.float32).contiguous()
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)))
            f.write(nb)
            f.write(struct.pack("<I", t.dim()))
            f.write(struct.pack(f"<{t.dim()}q", *t.shape))
            f.write(t.numpy().astype("<f4").tobytes())


def write_safetensors(path, named):
    """The weights as Hugging Face GPT2LMHeadModel saves them: "transformer." names, F32, the tied
    "lm_head.weight" stored as well. Written by hand (the format is 8 bytes of header length, a JSON
    header, then the raw data); Debian has no safetensors package for Python."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in named:
        blob = t.detach().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


# ---- The masked-loss reference ---------------------------------------------------------------
# The data the C++ masked-loss tests write (tests/train/loss_mask_test.cpp): the u16 token file
# of tests/train/train_fixture.h (token i = (i * 37 + 11) mod 64, N_TOKENS of them), and its loss
# mask (data/loss_mask.h): documents of 11 tokens whose first 4 (a prompt) are not trained on,
# byte j = 1 iff j mod 11 >= 4. Sequential sampling: sequence b reads the T + 1 tokens at
# o = (b * T) mod (N - T), and its target t counts iff mask byte o + t + 1 is 1 (else it is -1).
# Step s (1-based), microbatch j (0-based) holds sequences ((s - 1) * M + j) * B .. + B - 1.
N_TOKENS = 4000
MASKED_STEPS = 5


def tokens64():
    return torch.tensor([(i * 37 + 11) % 64 for i in range(N_TOKENS)], dtype=torch.int64)


def loss_mask64():
    return torch.tensor([j % 11 >= 4 for j in range(N_TOKENS)], dtype=torch.bool)


def masked_batch(data, mask, B, T, M, step, micro):
    """(tokens, targets) of microbatch `micro` of step `step`; targets the mask leaves out are -1."""
    tokens, targets = [], []
    for r in range(B):
        b = ((step - 1) * M + micro) * B + r
        off = (b * T) % (N_TOKENS - T)
        tokens.append(data[off:off + T])
        targets.append(torch.where(mask[off + 1:off + T + 1], data[off + 1:off + T + 1], -1))
    return torch.stack(tokens), torch.stack(targets)


def masked_training(params, batches, steps, forward_fn):
    """`steps` AdamW steps (the hyperparameters above, decay on tensors with >= 2 dims, constant lr,
    no clipping) of the masked mean loss: batches(step) gives the step's microbatches, and the
    loss is cross_entropy(ignore_index=-1, reduction="mean") over all of them flattened, as
    docs/config.md, Loss masks defines it. Returns each step's loss, measured before its update."""
    decay = [v for v in params.values() if v.dim() >= 2]
    no_decay = [v for v in params.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for step in range(1, steps + 1):
        opt.zero_grad()
        mbs = batches(step)
        # Rows do not interact: one forward over the microbatches stacked is the global batch.
        _, loss = forward_fn(torch.cat([t for t, _ in mbs]), torch.cat([g for _, g in mbs]))
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses


def masked_reference(out_dir):
    """gpt2_masked_ref: config [n_layer, n_head, n_embd, vocab, seq, batch, microbatches];
    adamw.hyper; tokens, targets (-1 where masked) of step 1, microbatch 0; param.<hf name>;
    logits, loss, grad.<hf name> of that microbatch alone (its masked mean); adamw.losses (5,)
    the step losses of the trainer (M microbatches of B sequences, masked mean over the global
    batch); final.<hf name> the parameters after the 5 updates."""
    n_layer, seq, batch, micro = 4, 8, 2, 8
    gen = torch.Generator().manual_seed(20261127)
    params = make_params(gen, n_layer=n_layer, seq=seq)
    params = {k: v.to(torch.float32).to(torch.float64).requires_grad_(True) for k, v in params.items()}
    data, mask = tokens64(), loss_mask64()
    tokens, targets = masked_batch(data, mask, batch, seq, micro, 1, 0)
    tensors = [("config", torch.tensor([n_layer, N_HEAD, N_EMBD, VOCAB, seq, batch, micro], dtype=torch.float64)),
               ("adamw.hyper", torch.tensor([LR, BETA1, BETA2, EPS, WD], dtype=torch.float64)),
               ("tokens", tokens.double()), ("targets", targets.double())]
    tensors += [("param." + k, v.detach().clone()) for k, v in params.items()]
    base = os.path.join(out_dir, "gpt2_masked_ref")
    hf = [("transformer." + k, v) for k, v in params.items()] + [("lm_head.weight", params["wte.weight"])]
    write_safetensors(base + ".safetensors", hf)
    logits, loss = forward(params, tokens, targets, n_layer)
    loss.backward()
    tensors += [("logits", logits), ("loss", loss.reshape(1))]
    tensors += [("grad." + k, v.grad.detach().clone()) for k, v in params.items()]
    losses = masked_training(
        params, lambda s: [masked_batch(data, mask, batch, seq, micro, s, j) for j in range(micro)], MASKED_STEPS,
        lambda tk, tg: forward(params, tk, tg, n_layer))
    tensors.append(("adamw.losses", torch.tensor(losses, dtype=torch.float64)))
    tensors += [("final." + k, v.detach().clone()) for k, v in params.items()]
    write(base + ".bin", tensors)
    print(f"wrote {base}.bin: masked loss {loss.item():.6f}, step losses {', '.join(f'{v:.6f}' for v in losses)}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/models/data/gpt2_tiny_ref.bin"
    gen = torch.Generator().manual_seed(20250101)
    params = make_params(gen)
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    tokens, targets = data[:, :-1], data[:, 1:]
    # Round the parameters to float32 first: the C++ side starts from exactly these values.
    params = {k: v.to(torch.float32).to(torch.float64).requires_grad_(True) for k, v in params.items()}
    tensors = [("config", torch.tensor([N_LAYER, N_HEAD, N_EMBD, VOCAB, SEQ, BATCH], dtype=torch.float64)),
               ("adamw.hyper", torch.tensor([LR, BETA1, BETA2, EPS, WD], dtype=torch.float64)),
               ("tokens", tokens.double()), ("targets", targets.double())]
    tensors += [("param." + k, v.detach().clone()) for k, v in params.items()]  # AdamW updates in place
    hf = [("transformer." + k, v) for k, v in params.items()] + [("lm_head.weight", params["wte.weight"])]
    write_safetensors(out.rsplit(".", 1)[0] + ".safetensors", hf)
    logits, loss = forward(params, tokens, targets)
    loss.backward()
    tensors += [("logits", logits), ("loss", loss.reshape(1))]
    tensors += [("grad." + k, v.grad.detach().clone()) for k, v in params.items()]

    decay = [v for v in params.values() if v.dim() >= 2]
    no_decay = [v for v in params.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        _, l = forward(params, tokens, targets)
        l.backward()
        losses.append(l.item())
        opt.step()
    tensors.append(("adamw.losses", torch.tensor(losses, dtype=torch.float64)))
    write(out, tensors)
    print(f"wrote {out}: loss {loss.item():.6f}, after {STEPS} AdamW steps {losses[-1]:.6f}")
    masked_reference(os.path.dirname(out) or ".")


if __name__ == "__main__":
    main()
