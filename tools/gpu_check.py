#!/usr/bin/env python3
"""Helpers of tools/gpu-check: reading what stp and CTest wrote, and the numbers of the report.
Each subcommand prints markdown (or one value) on stdout; exit 1 means the check it makes failed.
Tested without a GPU by tests/tools/gpu_check_test.sh.

  peak GPU_NAME                       "FP32 BF16" dense TFLOPS of a known GPU, or "unknown"
  flops L C V T                       training FLOPs per token (formula below)
  prereqs                             one line per missing build prerequisite (CMake >= 3.25, nvcc,
                                      NCCL >= 2.26 beside CUDA, in /usr, NCCL_ROOT or NCCL_HOME)
  ctest JUNIT[,JUNIT...] GPUS         classify the test results; fail on failures and on CUDA
                                      cases skipped for a reason other than "needs more GPUs"
  losses REF_JSONL GOT_JSONL RTOL     per-step loss table; fail if a relative difference > RTOL
  summary METRICS_JSONL [WARMUP]      JSON: medians of step_ms / tokens_per_s after WARMUP steps,
                                      max peak_device_bytes, offload totals
  plan PLAN_JSON                      JSON: feasible, max peak_device_bytes over ranks, min budget
  smi-max SMI_LOG                     largest memory.used (MiB) in an nvidia-smi -lms log
  predict NAME PLAN_JSON METRICS_JSONL WARMUP OUT_JSON
                                      the plan's predicted step and exposed copy time against the
                                      run's measured ones (below): one markdown table row on stdout,
                                      the numbers as JSON in OUT_JSON
  result OUT_DIR DRY_RUN FAILED...    writes OUT_DIR/result.json: the verdict, the failed checks,
                                      the predictions (OUT_DIR/prediction/*.json) and the late GEMM
                                      choices of every run (OUT_DIR/runs/*/metrics.jsonl)

Predicted vs measured (predict). The plan (`stp plan --json`) prices a step per rank as compute_s
(model FLOPs at the cost model's rate, cost_model in the JSON: train/planner_rates.h) plus
predicted_step_cost (recompute, exposed copies, optimizer offload, parameter streaming); the
predicted step is the largest over the ranks (the pipeline's bubble and the communication are not in
it). Its exposed copy time is the largest exposed_copy_s. Measured: the median step_ms after WARMUP
steps, and the median over those steps of the largest offload stall (`offload.stall_ms`, the time
compute waited for reloads; 0 when nothing offloads). Ratio = measured / predicted (null when the
prediction is 0).
"""
import json
import os
import re
import shutil
import subprocess
import statistics
import sys
import xml.etree.ElementTree as ET

# Dense (no sparsity) peak TFLOPS per GPU from NVIDIA's data sheets: FP32 on CUDA cores (what stp's
# f32 GEMMs use: cublasLtMatmul with CUBLAS_COMPUTE_32F, no TF32) and BF16 on tensor cores (what the
# bf16 path would use). Matched by substring of the nvidia-smi name, first match wins.
PEAKS = [
    ("H100 NVL", 60.0, 835.0),
    ("H100 PCIe", 51.2, 756.0),
    ("GH200", 67.0, 989.4),
    ("H200", 67.0, 989.4),
    ("H100", 67.0, 989.4),  # SXM5 (nvidia-smi: "NVIDIA H100 80GB HBM3")
    ("A100", 19.5, 312.0),
    ("L40S", 91.6, 362.1),
    ("L40", 90.5, 181.0),
    ("L4", 30.3, 121.0),
    ("A10", 31.2, 125.0),
]


def peak(name):
    for key, fp32, bf16 in PEAKS:
        if key in name:
            return fp32, bf16
    return None


def flops_per_token(L, C, V, T):
    """6 x (matmul parameters) + attention. Matmul parameters: 12 L C^2 (per block: qkv 3C^2, proj C^2,
    MLP 8C^2) + C V (the tied LM head); biases, LayerNorm and embedding lookups are left out. The
    attention term 12 L T C counts QK^T and AV (2 T C FLOPs each per token and layer, forward) times
    3 for forward + backward, over the full T x T scores (stp computes them all, then masks).
    Recomputation is not counted (MFU counts the model's FLOPs, not the hardware's)."""
    return 6 * (12 * L * C * C + C * V) + 12 * L * T * C


def read_jsonl(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    if not rows:
        raise SystemExit(f"gpu_check: {path} has no metrics")
    return rows


def cmd_ctest(junit, gpus):
    gpus = int(gpus)
    cases = [c for path in junit.split(",") for c in ET.parse(path).getroot().iter("testcase")]
    # Parameterised gtest names end in the kind: "Backends/OnDevice.Launch/cuda  # GetParam() = ...".
    is_cuda = re.compile(r"(/cuda\b|Cuda|CUDA|Gpu|GPU)")
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    cuda_rows, failures, other_skips, bad = [], [], [], 0
    for c in cases:
        name = c.get("name", "?").split("  # GetParam()")[0]
        out = (c.findtext("system-out") or "")
        if c.find("failure") is not None or c.get("status") == "fail":
            state = "failed"
            failures.append(name)
        elif c.find("skipped") is not None or c.get("status") in ("notrun", "disabled"):
            state = "skipped"
        else:
            state = "passed"
        counts[state] += 1
        if not is_cuda.search(name):
            if state == "skipped":
                other_skips.append(name)
            continue
        verdict = "ok" if state == "passed" else "FAILED"
        if state == "skipped":
            need = re.search(r"(\d+) GPU\(s\) visible, (\d+) needed", out)
            if need and int(need.group(2)) > gpus:
                verdict = f"ok: needs {need.group(2)} GPUs, this machine has {gpus}"
            elif "usable here" in out:
                verdict = "ok: tests the no-GPU path"
            else:
                lines = [l.strip() for l in out.splitlines()]
                reason = next((l for l in lines if "device here" in l), None) or next(
                    (l for l in lines if l and "Skipped" not in l and "SKIPPED" not in l), "no reason given")
                verdict = f"FAILED: skipped on a machine with {gpus} GPU(s) ({reason})"
        if verdict.startswith("FAILED"):
            bad += 1
        cuda_rows.append((name, state, verdict))
    total = sum(counts.values())
    print(f"{total} tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped.\n")
    print(f"CUDA cases ({len(cuda_rows)}): a CUDA case may be skipped only when it needs more GPUs than the machine has, "
          "or when it tests the no-GPU path.\n")
    print("| test | result | verdict |\n|---|---|---|")
    for name, state, verdict in cuda_rows:
        print(f"| `{name}` | {state} | {verdict} |")
    if failures:
        print("\nFailed tests: " + ", ".join(f"`{n}`" for n in failures))
    if other_skips:
        print("\nOther skipped tests (not CUDA cases): " + ", ".join(f"`{n}`" for n in other_skips))
    if not cuda_rows:
        print("\nNo CUDA case was found in the results: the GPU tests did not run.")
    return 1 if failures or bad or not cuda_rows else 0


def cmd_losses(ref_path, got_path, rtol):
    rtol = float(rtol)
    ref, got = read_jsonl(ref_path), read_jsonl(got_path)
    if [r["step"] for r in ref] != [g["step"] for g in got]:
        print(f"steps differ: {[r['step'] for r in ref]} vs {[g['step'] for g in got]}")
        return 1
    worst = 0.0
    print("| step | reference loss | loss | relative difference |\n|---|---|---|---|")
    for r, g in zip(ref, got):
        d = abs(g["loss"] - r["loss"]) / max(abs(r["loss"]), 1e-12)
        worst = max(worst, d)
        print(f"| {r['step']} | {r['loss']:.6f} | {g['loss']:.6f} | {d:.2e} |")
    ok = worst <= rtol
    print(f"\nlargest relative difference {worst:.2e} (tolerance {rtol:g}): {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


def cmd_summary(path, warmup="2"):
    rows = read_jsonl(path)
    warmup = int(warmup)
    timed = [r for r in rows if r["step"] > warmup] or rows
    out = {
        "steps": len(rows),
        "timed_steps": len(timed),
        "step_ms": statistics.median(r["step_ms"] for r in timed),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
        "peak_device_bytes": max(max(r["peak_device_bytes"]) for r in rows),
        "peak_host_pinned_bytes": max(r.get("peak_host_pinned_bytes", 0) for r in rows),
        "last_loss": rows[-1]["loss"],
    }
    late = late_gemm_choices(rows)
    if late is not None:
        out["late_gemm_choices"] = late
    off = [r["offload"] for r in timed if "offload" in r]
    if off:
        out["d2h_bytes_per_step"] = statistics.median(sum(o["d2h_bytes"]) for o in off)
        out["h2d_bytes_per_step"] = statistics.median(sum(o["h2d_bytes"]) for o in off)
        out["stall_ms_per_step"] = statistics.median(sum(o["stall_ms"]) for o in off)
        rates = [x for o in off for x in o["d2h_GBps"] if x > 0]
        out["d2h_GBps"] = statistics.median(rates) if rates else 0.0
    print(json.dumps(out))
    return 0


def cmd_predict(name, plan_path, metrics_path, warmup, out_path):
    plan = json.load(open(plan_path))
    ranks = plan.get("ranks", [])
    rows = read_jsonl(metrics_path)
    if not ranks or not rows:
        print(f"| {name} | no {'ranks in the plan' if not ranks else 'step in metrics.jsonl'} | | | | | | |")
        return 1
    warmup = int(warmup)
    timed = [r for r in rows if r["step"] > warmup] or rows

    def ratio(measured, predicted):
        return measured / predicted if predicted > 0 else None

    out = {
        "name": name,
        "steps": len(rows),
        "timed_steps": len(timed),
        "predicted_step_s": max(r["compute_s"] + r["predicted_step_cost"] for r in ranks),
        "measured_step_s": statistics.median(r["step_ms"] for r in timed) / 1e3,
        "predicted_exposed_copy_s": max(r["exposed_copy_s"] for r in ranks),
        "measured_exposed_copy_s": statistics.median(
            max(r["offload"]["stall_ms"]) / 1e3 if "offload" in r else 0.0 for r in timed),
        "cost_model": plan.get("cost_model"),
    }
    out["step_ratio"] = ratio(out["measured_step_s"], out["predicted_step_s"])
    out["exposed_copy_ratio"] = ratio(out["measured_exposed_copy_s"], out["predicted_exposed_copy_s"])
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")

    def ms(v):
        return f"{v * 1e3:.1f}"

    def x(v):
        return "n/a" if v is None else f"{v:.2f}"

    source = (out["cost_model"] or {}).get("source", "?")
    print(f"| {name} | {ms(out['predicted_step_s'])} | {ms(out['measured_step_s'])} | {x(out['step_ratio'])} | "
          f"{ms(out['predicted_exposed_copy_s'])} | {ms(out['measured_exposed_copy_s'])} | "
          f"{x(out['exposed_copy_ratio'])} | {source} |")
    return 0


def late_gemm_choices(rows):
    """Every step's late GEMM choices (metrics.jsonl `late_gemm_choices`, per device), summed; None
    when the run did not report them."""
    if not rows or not all("late_gemm_choices" in r for r in rows):
        return None
    return sum(sum(r["late_gemm_choices"]) for r in rows)


def cmd_result(out_dir, dry_run, *failed):
    predictions = []
    pred_dir = os.path.join(out_dir, "prediction")
    if os.path.isdir(pred_dir):
        for f in sorted(os.listdir(pred_dir)):
            if f.endswith(".json"):
                predictions.append(json.load(open(os.path.join(pred_dir, f))))
    late = {}
    runs = os.path.join(out_dir, "runs")
    if os.path.isdir(runs):
        for name in sorted(os.listdir(runs)):
            path = os.path.join(runs, name, "metrics.jsonl")
            if os.path.exists(path):
                late[name] = late_gemm_choices(read_jsonl(path))
    result = {"schema": "stp-gpu-check/1", "dry_run": dry_run == "1", "passed": not failed, "failed": list(failed),
              "predictions": predictions, "late_gemm_choices": late}
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    return 0


def cmd_plan(path):
    p = json.load(open(path))
    ranks = p.get("ranks", [])
    print(json.dumps({"feasible": bool(p.get("feasible")), "min_device_budget": p.get("min_device_budget"),
                      "peak_device_bytes": max((r["peak_device_bytes"] for r in ranks), default=0),
                      "host_pinned_bytes": max((r.get("host_pinned_bytes", 0) for r in ranks), default=0)}))
    return 0


def cmd_smi_max(path):
    best = 0
    with open(path) as f:
        for line in f:
            parts = [x.strip() for x in line.split(",")]
            if len(parts) >= 2 and parts[-1].isdigit():
                best = max(best, int(parts[-1]))
    print(best)
    return 0


def _version(text):
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(x or 0) for x in m.groups()) if m else None


def _nccl_version(header):
    try:
        text = open(header, encoding="utf-8", errors="replace").read()
    except OSError:
        return None
    parts = [re.search(rf"#define NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return tuple(int(p.group(1)) for p in parts) if all(parts) else None


def cmd_prereqs(env=None, run=None):
    """Prints one line per missing build prerequisite (what to install) and returns 1, or returns 0."""
    env = os.environ if env is None else env
    run = run or (lambda cmd: subprocess.run(cmd, capture_output=True, text=True, check=False).stdout)
    problems = []
    cmake = shutil.which("cmake", path=env.get("PATH"))
    v = _version(run([cmake, "--version"])) if cmake else None
    if not cmake:
        problems.append("CMake is missing: install CMake 3.25 or later (apt-get install cmake, or pip install cmake)")
    elif not v or v < (3, 25, 0):
        problems.append(f"CMake {'.'.join(map(str, v)) if v else '?'} is too old: stp needs 3.25 or later "
                        "(pip install cmake gives a current one)")
    cuda_home = env.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = shutil.which("nvcc", path=env.get("PATH")) or (
        os.path.join(cuda_home, "bin", "nvcc") if os.path.exists(os.path.join(cuda_home, "bin", "nvcc")) else None)
    if not nvcc:
        problems.append("nvcc is missing: install the CUDA toolkit 12.x or 13.x (cuda-toolkit) and put its bin/ on PATH")
    roots = [env.get("NCCL_ROOT"), env.get("NCCL_HOME")]
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    roots += [cuda_home, "/usr"]
    headers = [os.path.join(r, "include", "nccl.h") for r in roots if r]
    headers += [os.path.join(r, "targets", "x86_64-linux", "include", "nccl.h") for r in roots if r]
    found = [h for h in headers if os.path.exists(h)]
    if not found:
        problems.append("NCCL is missing: install libnccl2 and libnccl-dev (NVIDIA's CUDA repository), "
                        "or set NCCL_ROOT (or NCCL_HOME) to a folder with include/nccl.h and lib/libnccl.so")
    else:
        nv = _nccl_version(found[0])
        if nv and nv < (2, 26, 0):
            problems.append(f"NCCL {'.'.join(map(str, nv))} ({found[0]}) is too old: stp needs NCCL 2.26 or later "
                            "(install a newer libnccl2 and libnccl-dev, or set NCCL_ROOT to one)")
    for p in problems:
        print(p)
    return 1 if problems else 0


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[1], argv[2:]
    if cmd == "peak" and len(args) == 1:
        p = peak(args[0])
        print(f"{p[0]:g} {p[1]:g}" if p else "unknown")
        return 0
    if cmd == "prereqs" and not args:
        return cmd_prereqs()
    if cmd == "flops" and len(args) == 4:
        print(flops_per_token(*(int(a) for a in args)))
        return 0
    table = {"ctest": (cmd_ctest, 2), "losses": (cmd_losses, 3), "summary": (cmd_summary, (1, 2)), "plan": (cmd_plan, 1),
             "smi-max": (cmd_smi_max, 1), "predict": (cmd_predict, 5)}
    if cmd == "result" and len(args) >= 2:
        return cmd_result(*args)
    if cmd in table:
        fn, n = table[cmd]
        if len(args) in (n if isinstance(n, tuple) else (n,)):
            return fn(*args)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
