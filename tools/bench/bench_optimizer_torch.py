#!/usr/bin/python3
"""PyTorch side of tools/bench/bench_optimizer.cpp: torch.optim.AdamW(foreach=True) on N float32
parameters (split into tensors of at most --tensor elements), --threads threads. Prints one line
per repeat, "torch adamw_step_s S", after one warm-up step.

  /usr/bin/python3 tools/bench/bench_optimizer_torch.py --params N [--tensor 4194304 --threads T --reps 7]
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, required=True)
    ap.add_argument("--tensor", type=int, default=1 << 22)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    sizes = [min(a.tensor, a.params - at) for at in range(0, a.params, a.tensor)]
    params = [torch.nn.Parameter(torch.randn(n) * 0.02) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=True)
    opt.step()  # allocates the state
    for _ in range(a.reps):
        t0 = time.perf_counter()
        opt.step()
        print(f"torch adamw_step_s {time.perf_counter() - t0:.6f}", flush=True)


if __name__ == "__main__":
    main()
