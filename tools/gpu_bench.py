#!/usr/bin/env python3
"""The rows, the JSON and the table of tools/gpu-bench (its header documents what is measured).
Tested without a GPU by tests/tools/gpu_bench_test.sh (the dry run, the schema, the helpers).

  run --stp STP --dry-run 0|1 --gpu-csv "NAME, MiB, DRIVER" --smi NVIDIA_SMI
                         every row, result.json, the table; exit 1 when a row failed or timed out
  prepare BUILD_DIR DEST a stripped copy of BUILD_DIR/stp and its non-system runtime libraries (DEST/lib)
  libpath STP            the folders to add to LD_LIBRARY_PATH for the libraries the loader cannot find
                         (one line, ':'-separated; empty when none); exit 1 naming one still missing
  check-schema JSON      exit 1 (naming the first problem) unless JSON is a result of this schema
"""
import datetime
import glob
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time

SCHEMA = "stp-gpu-bench/1"
REFERENCE_PEAK = 989e12  # H100 / H200 SXM dense bf16, the issue's yardstick
ROW_NAMES = ["gemm-bf16", "stp-qwen2", "torch-eager", "stp-gpt2-350m", "torch-compile"]
# Per-row time limits (seconds) before the overall budget shrinks them; the order above is the run
# order: the riskiest row (a compile) comes last, so it can only lose itself.
ROW_LIMITS = {"gemm-bf16": 45, "stp-qwen2": 150, "torch-eager": 90, "stp-gpt2-350m": 90, "torch-compile": 150}
ROW_FIELDS = ["name", "kind", "model", "status", "reason", "wall_s", "limit_s", "steps", "timed_steps",
              "tokens_per_step", "step_ms", "tokens_per_s", "model_flops_per_token", "model_tflops_per_s",
              "mfu_vs_gemm", "mfu_vs_989", "peak_device_bytes", "planned_peak_device_bytes",
              "launches_per_step", "late_gemm_choices", "attention", "attention_log", "settings", "log"]
ATTENTION_PATHS = ("naive", "cudnn", "stp-kernel", "cudnn+stp-kernel")
STATUSES = ("ok", "failed", "timeout", "skipped")
TOP_FIELDS = ["schema", "dry_run", "when", "host", "commit", "stp_version", "device", "budget_s", "elapsed_s",
              "gemm_ceiling_flops", "reference_peak_flops", "rows", "ratios"]
DEVICE_FIELDS = ["name", "memory_mib", "driver", "cuda_driver", "cuda_runtime_torch", "cudnn_torch",
                 "cudnn_system", "torch", "transformers", "python"]

QWEN = "configs/qwen2-0.5b-gpu.yaml"
GPT2 = "configs/gpt2-350m-gpu.yaml"
# Tiny shapes of the dry run (CPU backend): seconds for the whole pipeline.
DRY_QWEN = ["model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.n_kv_head=2",
            "model.intermediate_size=128", "model.vocab_size=512", "model.seq_len=64",
            "train.micro_batch_size=2", "train.microbatches=2"]
DRY_GPT2 = ["model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.vocab_size=512", "model.seq_len=64",
            "train.micro_batch_size=2", "train.microbatches=2"]


def say(msg):
    print(f"gpu-bench: {msg}", flush=True)


def env_int(name, default, lo=1):
    v = os.environ.get(name, "")
    if not v:
        return default
    if not re.fullmatch(r"\d+", v) or int(v) < lo:
        raise SystemExit(f"gpu-bench: error: {name} must be a whole number >= {lo}, got '{v}'")
    return int(v)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---- environment --------------------------------------------------------------------------------

def capture(cmd, timeout=30, env=None):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return r.returncode, r.stdout
    except (OSError, subprocess.TimeoutExpired):
        return 1, ""


def device_info(gpu_csv, smi, dry_run):
    d = {k: None for k in DEVICE_FIELDS}
    d["python"] = sys.version.split()[0]
    if dry_run:
        d["name"] = "cpu (dry run)"
    elif gpu_csv:
        parts = [x.strip() for x in gpu_csv.split(",")]
        d["name"] = parts[0]
        d["memory_mib"] = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        d["driver"] = parts[2] if len(parts) > 2 else None
        rc, out = capture([smi])
        m = re.search(r"CUDA Version:\s*([0-9.]+)", out) if rc == 0 else None
        d["cuda_driver"] = m.group(1) if m else None
    probe = ("import json\nout = {}\ntry:\n import torch\n out['torch'] = torch.__version__\n"
             " out['cuda'] = torch.version.cuda\n out['cudnn'] = torch.backends.cudnn.version()\n"
             "except Exception:\n pass\ntry:\n import transformers\n out['transformers'] = transformers.__version__\n"
             "except Exception:\n pass\nprint(json.dumps(out))\n")
    rc, out = capture([sys.executable, "-c", probe], timeout=120)
    try:
        v = json.loads(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else {}
    except (ValueError, IndexError):
        v = {}
    d["torch"], d["cuda_runtime_torch"] = v.get("torch"), v.get("cuda")
    d["cudnn_torch"] = str(v["cudnn"]) if v.get("cudnn") else None
    d["transformers"] = v.get("transformers")
    rc, out = capture(["/sbin/ldconfig", "-p"]) if os.path.exists("/sbin/ldconfig") else (1, "")
    libs = sorted(set(re.findall(r"libcudnn\.so\.(\d+)", out)))
    d["cudnn_system"] = "libcudnn.so." + libs[-1] if libs else None
    return d


def stp_env():
    """The environment of stp's processes: the carried libraries first (STP_GPU_BENCH_LIBPATH, from
    tools/gpu-bench). Only stp's: PyTorch keeps the libraries it was built with."""
    extra = os.environ.get("STP_GPU_BENCH_LIBPATH", "")
    env = dict(os.environ)
    if extra:
        env["LD_LIBRARY_PATH"] = extra + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def stp_version(stp):
    rc, out = capture([stp, "--version"], env=stp_env())
    return out.strip() if rc == 0 else None


def commit_of(version):
    """The checkout's commit (the scripts and configs that ran), else the one `stp --version` names
    (the commit the build was configured at: "stp 0.1.0 (git abc1234)"), e.g. where .git did not
    travel with the tree."""
    rc, out = capture(["git", "rev-parse", "--short", "HEAD"])
    if rc == 0 and out.strip():
        return out.strip()
    m = re.search(r"\((?:git )?([0-9a-f]{7,40})", version or "")
    return m.group(1) if m else None


# ---- rows ---------------------------------------------------------------------------------------

def new_row(name, kind, model, limit):
    row = {k: None for k in ROW_FIELDS}
    row.update(name=name, kind=kind, model=model, status="skipped", limit_s=limit, settings=[])
    return row


def run_logged(cmd, log, limit, env=None, stdout_path=None):
    """Runs cmd with its output in log (stdout in stdout_path when given); returns (status, reason).
    A run past `limit` is killed, with every process it started."""
    with open(log, "w") as f, open(stdout_path or os.devnull, "w") as so:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            p = subprocess.Popen(cmd, stdout=so if stdout_path else f, stderr=subprocess.STDOUT if not stdout_path
                                 else f, env=env, start_new_session=True)
        except OSError as e:
            return "failed", f"cannot start {cmd[0]}: {e}"
        try:
            rc = p.wait(timeout=max(1, limit))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            return "timeout", f"killed after {limit:.0f} s (the row's time limit)"
    if rc != 0:
        return "failed", f"exit status {rc}: {last_error_line(log)}"
    return "ok", None


def last_error_line(log):
    try:
        lines = [l.strip() for l in open(log, errors="replace") if l.strip()]
    except OSError:
        return "no log"
    for l in reversed(lines):
        if "error" in l.lower():
            return l[:300]
    return lines[-1][:300] if lines else "no output"


def read_jsonl(path):
    rows = []
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line.endswith("}"):
                rows.append(json.loads(line))
    return rows


def text_file(out):
    """A deterministic byte text of 4 MB (word salad) for the stp rows: no data set needed."""
    path = os.path.join(out, "bench-text.txt")
    if not os.path.exists(path) or os.path.getsize(path) < 4_000_000:
        words = ("the pipeline braids forward and backward units of different microbatches so each "
                 "all-reduce hides under the other pass while offload copies run beside compute").split()
        x, parts, size = 12345, [], 0
        while size < 4_000_000:
            x = (x * 1103515245 + 12345) % 2**31
            w = words[(x >> 16) % len(words)] + " "
            parts.append(w)
            size += len(w)
        with open(path + ".tmp", "w") as f:
            f.write("".join(parts))
        os.replace(path + ".tmp", path)
    return path


def stp_settings(kind, dry_run, steps, data, gpu_mib):
    """--set KEY=VALUE list of an stp row (the same for its plan and its run)."""
    s = ["parallel.tp=1", "parallel.pp=1", "parallel.dp=1", "train.precision=bf16", f"train.steps={steps}",
         f"data.path={data}", "data.format=text", "data.sampling=random", "train.lr_schedule=constant",
         "train.warmup_steps=0", "output.log_every=1", "output.checkpoint_every=0", "output.trace=false",
         "model.init_from=null"]
    if kind == "qwen2":
        s += ["model.seq_len=2048", "train.micro_batch_size=2", "train.microbatches=16"]
    else:
        s += ["model.seq_len=1024", "train.micro_batch_size=8", "train.microbatches=4"]
    attention = os.environ.get("STP_GPU_BENCH_ATTENTION", "fused")
    s.append(f"model.attention={attention}")
    if dry_run:
        s += ["parallel.backend=cpu", "memory.device_budget=null", "memory.offload=none", "memory.recompute=none",
              "parallel.cpu_threads=2"]
        s += DRY_QWEN if kind == "qwen2" else DRY_GPT2
    else:
        # Memory taken up front (85% of the GPU), the levers only where the plan needs them.
        budget = (gpu_mib or 0) * 1024 * 1024 * 85 // 100
        s += ["parallel.backend=cuda", f"memory.device_budget={budget if budget else 'null'}",
              "memory.offload=auto", "memory.recompute=auto"]
    s += os.environ.get("STP_GPU_BENCH_SET", "").split()
    last = {kv.split("=", 1)[0]: kv for kv in s}  # a later setting of a key replaces the earlier one
    return [kv for kv in s if last[kv.split("=", 1)[0]] is kv]


# The lines stp prints (stderr, in the row's log) when it decides where the fused attention runs
# (core/cuda/cudnn_library.h and core/cuda/cudnn_attention.h): cuDNN for a shape, or its own kernel.
CUDNN_RUNS = re.compile(r"^stp: fused attention runs cuDNN ")
CUDNN_FALLBACK = re.compile(r"^stp: cuDNN (not found|not usable|fused attention refused) ")


def attention_path(settings, log):
    """(path, lines) of an stp row: naive, or for fused what stp's own lines in the log say ran:
    cudnn, stp-kernel (no cuDNN line: the CPU backend, f32; or a fallback line), or both."""
    attention = dict(kv.split("=", 1) for kv in settings).get("model.attention", "fused")
    if attention == "naive":
        return "naive", []
    lines = []
    try:
        with open(log, errors="replace") as f:
            lines = [ln.rstrip("\n") for ln in f if CUDNN_RUNS.match(ln) or CUDNN_FALLBACK.match(ln)]
    except OSError:
        pass
    runs = any(CUDNN_RUNS.match(ln) for ln in lines)
    falls = any(CUDNN_FALLBACK.match(ln) for ln in lines)
    return ("cudnn+stp-kernel" if runs and falls else "cudnn" if runs else "stp-kernel"), lines


def stp_row(name, kind, config, stp, out, dry_run, steps, warmup, limit, gpu_mib):
    row = new_row(name, "stp", "qwen2-0.5b" if kind == "qwen2" else "gpt2-350m", limit)
    settings = stp_settings(kind, dry_run, steps, text_file(out), gpu_mib)
    row["settings"] = settings
    sets = [a for kv in settings for a in ("--set", kv)]
    t0 = time.monotonic()
    plan_log = os.path.join(out, "logs", f"{name}-plan.log")
    plan_json = os.path.join(out, "logs", f"{name}-plan.json")
    status, reason = run_logged([stp, "plan", config, *sets, "--json"], plan_log, min(60, limit), stp_env(),
                                stdout_path=plan_json)
    plan = None
    try:  # the plan is printed even when it does not fit (status 1); the train run then says why
        plan = json.load(open(plan_json))
    except (OSError, ValueError):
        pass
    if plan is None:
        row.update(status="failed" if status != "timeout" else status,
                   reason=f"stp plan: {reason or 'no JSON printed'}", wall_s=round(time.monotonic() - t0, 1),
                   log=os.path.relpath(plan_log, out))
        return row
    row["model_flops_per_token"] = plan.get("model_flops_per_token")
    row["tokens_per_step"] = plan.get("tokens_per_step")
    row["planned_peak_device_bytes"] = max((r["peak_device_bytes"] for r in plan.get("ranks", [])), default=None)
    run_dir = os.path.join(out, "runs", name)
    shutil.rmtree(run_dir, ignore_errors=True)
    log = os.path.join(out, "logs", f"{name}.log")
    row["log"] = os.path.relpath(log, out)
    left = limit - (time.monotonic() - t0)
    status, reason = run_logged([stp, "train", config, *sets, "--set", f"output.dir={run_dir}"], log, left,
                                stp_env())
    row["wall_s"] = round(time.monotonic() - t0, 1)
    row["attention"], row["attention_log"] = attention_path(settings, log)
    metrics = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    row["steps"] = len(metrics)
    timed = [m for m in metrics if m["step"] > warmup]
    if timed:
        row["timed_steps"] = len(timed)
        row["step_ms"] = median(m["step_ms"] for m in timed)
        row["tokens_per_s"] = median(m["tokens_per_s"] for m in timed)
        row["peak_device_bytes"] = max(max(m["peak_device_bytes"]) for m in metrics)
        if all("launches" in m for m in timed):
            row["launches_per_step"] = int(median(sum(m["launches"]) for m in timed))
    # Every step's, warm-up included: a shape setup missed is chosen in the first step that runs it.
    if metrics and all("late_gemm_choices" in m for m in metrics):
        row["late_gemm_choices"] = sum(sum(m["late_gemm_choices"]) for m in metrics)
    row["status"], row["reason"] = status, reason
    if status == "ok" and not timed:
        row["status"], row["reason"] = "failed", f"no step after the {warmup} warm-up steps in metrics.jsonl"
    return row


def torch_row(name, mode, config_row_settings, out, dry_run, steps, warmup, limit, flops, tokens_per_step):
    """The PyTorch rows and the GEMM row run in a child python (tools/gpu_bench_torch.py)."""
    kind = "gemm" if mode == "gemm" else "torch"
    row = new_row(name, kind, None if mode == "gemm" else "qwen2-0.5b", limit)
    log = os.path.join(out, "logs", f"{name}.log")
    result = os.path.join(out, "logs", f"{name}.json")
    row["log"] = os.path.relpath(log, out)
    if os.path.exists(result):
        os.remove(result)
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, os.path.join(here, "gpu_bench_torch.py"), "--mode", mode, "--out", result,
           "--steps", str(steps), "--warmup", str(warmup)]
    if dry_run:
        cmd.append("--cpu")
    if mode != "gemm":
        cmd += ["--shape", json.dumps(config_row_settings)]
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    status, reason = run_logged(cmd, log, limit, env)
    row["wall_s"] = round(time.monotonic() - t0, 1)
    got = {}
    if os.path.exists(result):
        got = json.load(open(result))
    if got.get("skipped"):
        row.update(status="skipped", reason=got["skipped"])
        return row
    row["status"], row["reason"] = status, reason
    if mode == "gemm":
        row["model_tflops_per_s"] = got.get("flops_per_s") / 1e12 if got.get("flops_per_s") else None
        row["settings"] = [f"n={got.get('n')}", f"dtype={got.get('dtype')}"]
        row["gemm_flops_per_s"] = got.get("flops_per_s")
        if status == "ok" and not got.get("flops_per_s"):
            row.update(status="failed", reason="no rate measured")
        return row
    row["settings"] = [f"{k}={v}" for k, v in sorted(got.get("settings", {}).items())]
    row["steps"], row["timed_steps"] = got.get("steps"), got.get("timed_steps")
    row["step_ms"], row["tokens_per_s"] = got.get("step_ms"), got.get("tokens_per_s")
    row["peak_device_bytes"], row["launches_per_step"] = got.get("peak_device_bytes"), got.get("launches_per_step")
    row["model_flops_per_token"], row["tokens_per_step"] = flops, got.get("tokens_per_step")
    if tokens_per_step and got.get("tokens_per_step") and tokens_per_step != got["tokens_per_step"]:
        row.update(status="failed", reason=f"{got['tokens_per_step']} tokens per step, stp's row has {tokens_per_step}")
        return row
    if status == "ok" and not row["tokens_per_s"]:
        row.update(status="failed", reason="no timed step")
    return row


def torch_shape(settings):
    """The model shape and batch of an stp row's settings plus its config, for the torch child."""
    return {kv.split("=", 1)[0]: kv.split("=", 1)[1] for kv in settings}


def load_shape(config, settings):
    """Reads the YAML keys the torch model needs from the config, then applies the settings."""
    shape = {}
    section = None
    for line in open(config):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            section = line.split(":")[0].strip()
            continue
        key, _, value = line.strip().partition(":")
        value = value.split("#")[0].strip()
        shape[f"{section}.{key.strip()}"] = value
    shape.update(torch_shape(settings))
    keep = ("model.", "train.micro_batch_size", "train.microbatches", "train.lr", "train.grad_clip", "optim.",
            "train.seed")
    return {k: v for k, v in shape.items() if k.startswith(keep)}


def finish_row(row, ceiling):
    if row["kind"] == "gemm":
        return
    f, t = row.get("model_flops_per_token"), row.get("tokens_per_s")
    if f and t:
        row["model_tflops_per_s"] = f * t / 1e12
        row["mfu_vs_989"] = f * t / REFERENCE_PEAK
        row["mfu_vs_gemm"] = f * t / ceiling if ceiling else None


def cmd_run(argv):
    args = dict(zip(argv[::2], argv[1::2]))
    stp, dry_run, gpu_csv, smi = args["--stp"], args["--dry-run"] == "1", args.get("--gpu-csv", ""), args["--smi"]
    out = os.path.abspath(os.environ.get("STP_GPU_BENCH_DIR", "runs/gpu-bench"))
    budget = env_int("STP_GPU_BENCH_BUDGET", 420)
    steps = env_int("STP_GPU_BENCH_STEPS", 3 if dry_run else 6, lo=2)
    warmup = env_int("STP_GPU_BENCH_WARMUP", 1 if dry_run else 2, lo=0)
    if warmup >= steps:
        raise SystemExit(f"gpu-bench: error: STP_GPU_BENCH_WARMUP ({warmup}) must be below "
                         f"STP_GPU_BENCH_STEPS ({steps})")
    wanted = [r.strip() for r in os.environ.get("STP_GPU_BENCH_ROWS", ",".join(ROW_NAMES)).split(",") if r.strip()]
    for r in wanted:
        if r not in ROW_NAMES:
            raise SystemExit(f"gpu-bench: error: STP_GPU_BENCH_ROWS names '{r}'; the rows are {', '.join(ROW_NAMES)}")
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    t_start = time.monotonic()
    version = stp_version(stp)
    if version is None:
        raise SystemExit(f"gpu-bench: error: '{stp} --version' failed: the build does not run here "
                         "(a missing library? `ldd` it)")
    device = device_info(gpu_csv, smi, dry_run)
    gpu_mib = device.get("memory_mib")
    say(f"{'dry run on the CPU backend' if dry_run else device['name']}; {version}; budget {budget} s; "
        f"output {out}")
    result = {k: None for k in TOP_FIELDS}
    result.update(schema=SCHEMA, dry_run=dry_run, when=datetime.datetime.now(datetime.timezone.utc)
                  .strftime("%Y-%m-%dT%H:%M:%SZ"), host=socket.gethostname(), stp_version=version,
                  commit=commit_of(version), device=device, budget_s=budget, reference_peak_flops=REFERENCE_PEAK,
                  rows=[])
    qwen_settings = stp_settings("qwen2", dry_run, steps, text_file(out), gpu_mib)
    shape = load_shape(QWEN, qwen_settings)
    flops = tokens = None
    for name in ROW_NAMES:
        left = budget - (time.monotonic() - t_start)
        limit = int(min(ROW_LIMITS[name], left))
        if name not in wanted:
            row = new_row(name, "gemm" if name == "gemm-bf16" else "stp" if name.startswith("stp") else "torch",
                          None, 0)
            row["reason"] = "not in STP_GPU_BENCH_ROWS"
        elif limit < 5:
            row = new_row(name, "", None, max(limit, 0))
            row.update(status="timeout", reason=f"the call's budget ({budget} s) was spent before this row")
        else:
            say(f"{name} (limit {limit} s)")
            if name == "gemm-bf16":
                row = torch_row(name, "gemm", None, out, dry_run, steps, warmup, limit, None, None)
            elif name == "stp-qwen2":
                row = stp_row(name, "qwen2", QWEN, stp, out, dry_run, steps, warmup, limit, gpu_mib)
                flops, tokens = row["model_flops_per_token"], row["tokens_per_step"]
            elif name == "stp-gpt2-350m":
                row = stp_row(name, "gpt2", GPT2, stp, out, dry_run, steps, warmup, limit, gpu_mib)
            else:
                row = torch_row(name, name.split("-")[1], shape, out, dry_run, steps, warmup, limit, flops, tokens)
            say(f"{name}: {row['status']}" + (f" ({row['reason']})" if row["reason"] else ""))
        result["rows"].append(row)
    gemm = next(r for r in result["rows"] if r["name"] == "gemm-bf16")
    ceiling = gemm.pop("gemm_flops_per_s", None) if gemm["status"] == "ok" else None
    gemm.pop("gemm_flops_per_s", None)
    result["gemm_ceiling_flops"] = ceiling
    for row in result["rows"]:
        finish_row(row, ceiling)
    by = {r["name"]: r for r in result["rows"]}

    def ratio(a, b):
        x, y = by[a].get("tokens_per_s"), by[b].get("tokens_per_s")
        ok = by[a]["status"] == "ok" and by[b]["status"] == "ok"
        return round(x / y, 4) if ok and x and y else None

    result["ratios"] = {"stp_over_eager": ratio("stp-qwen2", "torch-eager"),
                        "stp_over_compile": ratio("stp-qwen2", "torch-compile")}
    result["elapsed_s"] = round(time.monotonic() - t_start, 1)
    problem = check_schema(result)
    if problem:
        raise SystemExit(f"gpu-bench: error: internal: the result breaks its own schema: {problem}")
    path = os.path.join(out, "result.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print_table(result)
    say(f"result: {path}")
    bad = [r["name"] for r in result["rows"] if r["status"] in ("failed", "timeout")]
    if not dry_run:
        bad += [r["name"] for r in result["rows"] if r["status"] == "skipped" and r["name"] in wanted]
    if bad:
        say(f"FAILED rows: {', '.join(bad)} (see their logs under {out}/logs)")
        return 1
    return 0


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def print_table(result):
    ratios = result["ratios"]
    ceiling = result["gemm_ceiling_flops"]
    print(f"\ngpu-bench: {result['device']['name']}, driver {result['device']['driver'] or '-'}, "
          f"cuDNN {result['device']['cudnn_torch'] or '-'} (torch) / {result['device']['cudnn_system'] or '-'}, "
          f"commit {result['commit'] or '-'}; GEMM ceiling {fmt(ceiling and ceiling / 1e12, '.0f')} TFLOP/s")
    head = f"{'row':<15} {'status':<8} {'tokens/s':>10} {'step ms':>9} {'MFU/gemm':>9} {'MFU/989':>8} " \
           f"{'peak MiB':>9} {'launches':>9} {'late GEMM':>9}  attention"
    print(head)
    print("-" * len(head))
    for r in result["rows"]:
        if r["kind"] == "gemm":
            print(f"{r['name']:<15} {r['status']:<8} {fmt(r['model_tflops_per_s'], '.1f'):>10} TFLOP/s")
            continue
        peak = r["peak_device_bytes"] / 2**20 if r["peak_device_bytes"] is not None else None
        mg = r["mfu_vs_gemm"] * 100 if r["mfu_vs_gemm"] is not None else None
        mr = r["mfu_vs_989"] * 100 if r["mfu_vs_989"] is not None else None
        print(f"{r['name']:<15} {r['status']:<8} {fmt(r['tokens_per_s'], ',.0f'):>10} {fmt(r['step_ms'], '.1f'):>9} "
              f"{fmt(mg, '.2f'):>8}% {fmt(mr, '.2f'):>7}% {fmt(peak, ',.1f'):>9} "
              f"{fmt(r['launches_per_step'], '.0f'):>9} {fmt(r['late_gemm_choices'], 'd'):>9}  {r['attention'] or '-'}")
    print(f"stp/eager {fmt(ratios['stp_over_eager'], '.3f')}   stp/compile {fmt(ratios['stp_over_compile'], '.3f')}")


# ---- schema -------------------------------------------------------------------------------------

def check_result_frame(r, schema, top_fields, items, item, names, item_fields):
    """The first way r differs from what every result of these tools shares, or None: an object
    with top_fields, `schema`, a device with DEVICE_FIELDS, and under r[items] one entry per name
    of `names` (in order), each with exactly item_fields, a status of STATUSES and, unless it is
    "ok", a reason. `item` names an entry in the messages ("row", "run")."""
    if not isinstance(r, dict):
        return "not an object"
    for k in top_fields:
        if k not in r:
            return f"missing key '{k}'"
    if r["schema"] != schema:
        return f"schema is '{r['schema']}', expected '{schema}'"
    for k in DEVICE_FIELDS:
        if k not in r["device"]:
            return f"device: missing key '{k}'"
    got = [e.get("name") for e in r[items]]
    if got != names:
        return f"{items} are {got}, expected {names}"
    for e in r[items]:
        for k in item_fields:
            if k not in e:
                return f"{item} {e['name']}: missing key '{k}'"
        extra = set(e) - set(item_fields)
        if extra:
            return f"{item} {e['name']}: unknown keys {sorted(extra)}"
        if e["status"] not in STATUSES:
            return f"{item} {e['name']}: status '{e['status']}'"
        if e["status"] != "ok" and not e["reason"]:
            return f"{item} {e['name']}: status {e['status']} without a reason"
    return None


def check_schema(r):
    """The first way r differs from the schema, or None."""
    problem = check_result_frame(r, SCHEMA, TOP_FIELDS, "rows", "row", ROW_NAMES, ROW_FIELDS)
    if problem:
        return problem
    for row in r["rows"]:
        if row["kind"] == "stp" and row["status"] == "ok" and row["attention"] not in ATTENTION_PATHS:
            return f"row {row['name']}: attention is {row['attention']!r}, expected one of {list(ATTENTION_PATHS)}"
        if row["status"] == "ok" and row["kind"] in ("stp", "torch"):
            need = ["tokens_per_s", "step_ms", "tokens_per_step"]
            if row["kind"] == "stp":  # the torch rows borrow stp-qwen2's FLOPs, when it got that far
                need += ["model_flops_per_token", "mfu_vs_989"]
            for k in need:
                if not isinstance(row[k], (int, float)) or row[k] <= 0:
                    return f"row {row['name']}: {k} is {row[k]!r}, expected a positive number"
    if set(r["ratios"]) != {"stp_over_eager", "stp_over_compile"}:
        return f"ratios: keys {sorted(r['ratios'])}"
    return None


def cmd_check_schema(path):
    problem = check_schema(json.load(open(path)))
    if problem:
        print(f"gpu-bench: {path}: {problem}")
        return 1
    return 0


# ---- carrying a build ---------------------------------------------------------------------------

# Provided by the GPU machine (glibc and the compiler's runtime, newer there than on the building
# machine, the driver) or looked up there (CUDA's libraries): never copied.
SYSTEM_LIBS = re.compile(r"^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|"
                         r"libstdc\+\+|libgcc_s|libz\.so|libudev|"
                         r"libcuda\.so|libnvidia|libcudart|libcublas|libcublasLt|libcudnn|libnccl|libnvrtc|"
                         r"libnvJitLink|libcufft|libcurand|libcusparse|libcusolver)")


def ldd(binary):
    rc, out = capture(["ldd", binary])
    found, missing = {}, []
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(not found|\S+)", line)
        if not m:
            continue
        if m.group(2) == "not found":
            missing.append(m.group(1))
        else:
            found[m.group(1)] = m.group(2)
    return found, missing


def cmd_prepare(build, dest):
    """dest/stp (a stripped copy of build/stp) and dest/lib (its non-system runtime libraries)."""
    found, missing = ldd(os.path.join(build, "stp"))
    shutil.rmtree(dest, ignore_errors=True)
    lib = os.path.join(dest, "lib")
    os.makedirs(lib)
    stp = os.path.join(dest, "stp")
    shutil.copy2(os.path.join(build, "stp"), stp)
    copied = 0
    for name, path in sorted(found.items()):
        if SYSTEM_LIBS.match(name):
            continue
        shutil.copy2(os.path.realpath(path), os.path.join(lib, name))
        copied += 1
    rc, _ = capture(["strip", stp])
    size = sum(os.path.getsize(os.path.join(lib, f)) for f in os.listdir(lib)) + os.path.getsize(stp)
    say(f"{dest}: stp ({'stripped' if rc == 0 else 'NOT stripped: no strip here'}) and {copied} libraries, "
        f"{size / 2**20:.1f} MiB to carry" + (f"; not found here: {', '.join(missing)}" if missing else ""))
    return 0


# Opened by stp at run time (dlopen), so ldd does not list it: cuDNN (core/cuda/cudnn_library.h).
# Without it stp's fused attention runs its own CUDA kernel and says so in each row's log.
DLOPENED = ["libcudnn.so.9"]


def loader_finds(name):
    """Whether dlopen(name) would find it: a folder of LD_LIBRARY_PATH, or the ldconfig cache."""
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if d and os.path.exists(os.path.join(d, name)):
            return True
    rc, out = capture(["/sbin/ldconfig", "-p"]) if os.path.exists("/sbin/ldconfig") else (1, "")
    return rc == 0 and re.search(r"^\s*" + re.escape(name) + r"\s", out, re.M) is not None


def cmd_libpath(stp):
    _, missing = ldd(stp)  # with the carried libraries on LD_LIBRARY_PATH (tools/gpu-bench)
    roots = glob.glob("/usr/local/cuda*/lib64") + glob.glob("/usr/local/cuda*/lib") + \
        glob.glob("/usr/local/cuda*/targets/*/lib") + glob.glob("/usr/lib/x86_64-linux-gnu")
    for sp in sys.path:
        roots += glob.glob(os.path.join(sp, "nvidia", "*", "lib"))
    dirs = []
    for name in DLOPENED:
        if loader_finds(name):
            continue
        hit = next((d for d in roots if os.path.exists(os.path.join(d, name))), None)
        if hit is None:
            print(f"gpu-bench: {name} is not on this machine: stp's fused attention runs its own CUDA kernel "
                  "(each stp row's log says so)", file=sys.stderr)
            continue
        dirs.append(hit)
        # A cuDNN from NVIDIA's Python packages opens its CUDA's NVRTC and cuBLASLt from their packages.
        for sib in ("cuda_nvrtc", "cublas"):
            d = os.path.join(os.path.dirname(os.path.dirname(hit)), sib, "lib")
            if os.path.isdir(d) and d not in dirs:
                dirs.append(d)
    for name in missing:
        hit = next((d for d in roots if os.path.exists(os.path.join(d, name))), None)
        if hit is None:
            print(f"gpu-bench: error: {stp} needs {name}, which is neither carried (tools/gpu-bench --prepare) "
                  "nor in the CUDA toolkit or NVIDIA's Python packages here", file=sys.stderr)
            return 1
        if hit not in dirs:
            dirs.append(hit)
    print(":".join(dirs))
    return 0


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "run":
        return cmd_run(args)
    if cmd == "prepare" and len(args) == 2:
        return cmd_prepare(args[0], args[1])
    if cmd == "libpath" and len(args) == 1:
        return cmd_libpath(args[0])
    if cmd == "check-schema" and len(args) == 1:
        return cmd_check_schema(args[0])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
