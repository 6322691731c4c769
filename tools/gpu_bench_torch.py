#!/usr/bin/env python3
"""PyTorch rows of tools/gpu-bench, one per process (its time limit kills only this row).

  --mode gemm      the bf16 GEMM ceiling: torch.matmul of two random N x N bf16 matrices (N 8192; 256
                   with --cpu), median of 10 timed products after 3 warm-ups (CUDA events)
  --mode eager     Qwen2ForCausalLM (transformers) from --shape (stp config keys: model.*, train.*,
                   optim.*) with random weights, attn_implementation "sdpa", f32 master weights under
                   bf16 autocast, fused AdamW, gradient clipping at train.grad_clip, gradient
                   accumulation over train.microbatches micro-batches of train.micro_batch_size
                   sequences of model.seq_len random tokens (the tokens per step of stp's row)
  --mode compile   the same model under torch.compile (with --cpu: backend "eager", so a dry run
                   exercises the path without a C++ compiler's minutes)
Writes --out (JSON): steps, timed_steps, step_ms and tokens_per_s (medians after --warmup steps),
tokens_per_step, peak_device_bytes (torch.cuda.max_memory_allocated), launches_per_step (CUDA kernels,
memsets and copies torch.profiler records over one more step), settings; or {"skipped": why} when
torch or transformers do not import (status 0 then).
"""
import argparse
import inspect
import json
import statistics
import sys
import time


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def gemm(args, torch):
    dev = "cpu" if args.cpu else "cuda"
    n = 256 if args.cpu else 8192
    g = torch.Generator(device=dev).manual_seed(1234)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)  # never zeros: they run faster
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
    times = []
    for i in range(13):
        if args.cpu:
            t0 = time.perf_counter()
            torch.matmul(a, b)
            dt = time.perf_counter() - t0
        else:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            torch.matmul(a, b)
            e1.record()
            e1.synchronize()
            dt = e0.elapsed_time(e1) / 1e3
        if i >= 3:
            times.append(dt)
    t = statistics.median(times)
    return {"n": n, "dtype": "bf16", "seconds": t, "flops_per_s": 2.0 * n ** 3 / t}


def qwen2_config(shape, transformers):
    def get(key, default=None, cast=int):
        v = shape.get(key, default)
        return default if v in (None, "null", "") else cast(v)
    kw = dict(vocab_size=get("model.vocab_size"), hidden_size=get("model.n_embd"),
              intermediate_size=get("model.intermediate_size"), num_hidden_layers=get("model.n_layer"),
              num_attention_heads=get("model.n_head"), num_key_value_heads=get("model.n_kv_head"),
              max_position_embeddings=get("model.seq_len"), rms_norm_eps=get("model.norm_eps", 1e-6, float),
              tie_word_embeddings=str(shape.get("model.tie_embeddings", "true")).lower() == "true",
              use_cache=False, attn_implementation="sdpa")
    theta = get("model.rope_theta", 10000.0, float)
    params = inspect.signature(transformers.Qwen2Config.__init__).parameters
    if "rope_parameters" in params:  # transformers 5
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    else:
        kw["rope_theta"] = theta
    return transformers.Qwen2Config(**kw)


def train(args, torch, transformers):
    import torch.nn.functional as F
    shape = json.loads(args.shape)
    cuda = not args.cpu
    dev = "cuda" if cuda else "cpu"
    B, m, T = int(shape["train.micro_batch_size"]), int(shape["train.microbatches"]), int(shape["model.seq_len"])
    torch.manual_seed(int(shape.get("train.seed", 1234)))
    cfg = qwen2_config(shape, transformers)
    with torch.device(dev):
        model = transformers.Qwen2ForCausalLM(cfg)  # f32 master weights
    model.train()
    V = cfg.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=float(shape.get("train.lr", 3e-4)),
                            betas=(float(shape.get("optim.beta1", 0.9)), float(shape.get("optim.beta2", 0.95))),
                            eps=float(shape.get("optim.eps", 1e-8)),
                            weight_decay=float(shape.get("optim.weight_decay", 0.1)),
                            **({"fused": True} if cuda else {"foreach": True}))
    clip = float(shape.get("train.grad_clip", 1.0))
    fwd = model
    if args.mode == "compile":
        fwd = torch.compile(model, backend="eager") if args.cpu else torch.compile(model)
    g = torch.Generator(device=dev).manual_seed(7)
    data = [torch.randint(0, V, (B, T + 1), device=dev, generator=g) for _ in range(m)]

    def step():
        opt.zero_grad(set_to_none=True)
        for batch in data:
            x, y = batch[:, :-1], batch[:, 1:]
            with torch.autocast(device_type=dev, dtype=torch.bfloat16):
                logits = fwd(input_ids=x).logits
            loss = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1)) / m
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.steps):
        sync()
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
        print(f"step {i + 1}: {times[-1] * 1e3:.1f} ms, loss {float(loss) * m:.4f}", flush=True)
    timed = times[args.warmup:]
    tokens = B * m * T
    out = {"steps": len(times), "timed_steps": len(timed), "step_ms": statistics.median(timed) * 1e3,
           "tokens_per_s": tokens / statistics.median(timed), "tokens_per_step": tokens,
           "peak_device_bytes": torch.cuda.max_memory_allocated() if cuda else None, "launches_per_step": None,
           "settings": {"torch": torch.__version__, "transformers": transformers.__version__, "mode": args.mode,
                        "attn_implementation": "sdpa", "autocast": "bf16", "masters": "f32",
                        "adamw": "fused" if cuda else "foreach", "clip": clip, "micro_batch_size": B,
                        "microbatches": m, "seq_len": T}}
    if cuda:  # one more step under the profiler: every kernel, memset and copy it records on the GPU
        try:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                sync()
            cuda_type = torch.autograd.DeviceType.CUDA
            try:  # Kineto's raw records: one per kernel, memset and copy the GPU ran
                n = sum(1 for e in prof.profiler.kineto_results.events() if e.device_type() == cuda_type)
            except Exception:
                n = sum(1 for e in prof.events() if e.device_type == cuda_type)
            out["launches_per_step"] = n
        except Exception as e:  # the count is a bonus: its failure loses no measurement
            print(f"launch count: {e}", flush=True)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["gemm", "eager", "compile"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--shape", default="{}")
    p.add_argument("--cpu", action="store_true")
    args = p.parse_args()
    try:
        import torch
    except Exception as e:
        write(args.out, {"skipped": f"torch does not import in {sys.executable} ({type(e).__name__}: {e})"})
        return 0
    if not args.cpu and not torch.cuda.is_available():
        write(args.out, {"error": "torch sees no CUDA device"})
        print("gpu-bench torch: error: torch sees no CUDA device", file=sys.stderr)
        return 1
    if args.mode == "gemm":
        write(args.out, gemm(args, torch))
        return 0
    try:
        import transformers
    except Exception as e:
        write(args.out, {"skipped": f"transformers does not import in {sys.executable} ({type(e).__name__}: {e})"})
        return 0
    write(args.out, train(args, torch, transformers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
