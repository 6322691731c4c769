#!/usr/bin/env bash
# CTest: tools.gpu_bench_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# tools/gpu-bench without a GPU: with a missing or failing nvidia-smi it stops at once with one
# clear line, status 1, and writes nothing; --dry-run runs every row on the CPU backend at tiny
# shapes (the torch rows run on the CPU when torch and transformers import, else are skipped with a
# reason) and writes result.json of the same schema as a GPU run, which the schema check accepts;
# the stp rows report tokens/s, MFU, peaks and launches per step; a row past the call's budget is
# reported as such without losing the JSON; the schema check refuses a broken result.
set -euo pipefail
src="$1"
bin="$2"
bench="$src/tools/gpu-bench"
helper="$src/tools/gpu_bench.py"
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
[ -x "$bin/stp" ] || { echo "$bin/stp not built: skipped"; exit 77; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
bad() { echo "FAIL: $*"; failures=$((failures + 1)); }
export STP_GPU_BENCH_DIR="$tmp/out" STP_GPU_BENCH_BUILD_DIR="$bin"

# expect_one_line NAME NEEDLE: status 1 at once, one line `gpu-bench: error: ...` holding NEEDLE,
# nothing written.
expect_one_line() {
  local name=$1 needle=$2 rc=0
  timeout 60 "$bench" >"$tmp/$name.out" 2>&1 || rc=$?
  [ "$rc" = 1 ] || bad "$name: status $rc, expected 1: $(cat "$tmp/$name.out")"
  [ "$(wc -l <"$tmp/$name.out")" = 1 ] || bad "$name: expected one line: $(cat "$tmp/$name.out")"
  grep -qF -- "$needle" "$tmp/$name.out" || bad "$name: '$needle' not in: $(cat "$tmp/$name.out")"
  grep -q '^gpu-bench: error: ' "$tmp/$name.out" || bad "$name: not a 'gpu-bench: error:' line"
  [ ! -e "$tmp/out" ] || bad "$name: wrote $tmp/out"
}
STP_NVIDIA_SMI="$tmp/missing/nvidia-smi" expect_one_line no-smi "no NVIDIA GPU here"
printf '#!/usr/bin/env bash\necho "No devices were found"\nexit 6\n' >"$tmp/nvidia-smi"
chmod +x "$tmp/nvidia-smi"
STP_NVIDIA_SMI="$tmp/nvidia-smi" expect_one_line no-devices "No devices were found"

rc=0
"$bench" --bogus >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || bad "unknown option: status $rc, expected 2"
"$bench" --help >"$tmp/help.out" 2>&1 || bad "--help: status $?"
grep -q -- "--dry-run" "$tmp/help.out" || bad "--help does not document --dry-run"

# The dry run: every row, the JSON, the table.
start=$SECONDS
rc=0
"$bench" --dry-run >"$tmp/dry.out" 2>&1 || rc=$?
cat "$tmp/dry.out"
[ "$rc" = 0 ] || bad "dry run: status $rc"
((SECONDS - start <= 120)) || bad "dry run took $((SECONDS - start)) s"
json="$tmp/out/result.json"
# Which attention an stp row ran, from the lines stp prints (core/cuda/cudnn_attention.h): cuDNN's
# line, the fallback lines, both, none; naive whatever the log says.
python3 - "$helper" "$tmp" <<'EOF' || bad "attention_path: reading stp's attention lines"
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("gpu_bench", sys.argv[1])
gb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gb)
runs = ("stp: fused attention runs cuDNN 9.19.0 for B 2 T 2048 NH 14 NKV 2 D 64 bf16: forward engine 8 "
        "(0 bytes of workspace), backward engine 9 (1 bytes)")
missing = ("stp: cuDNN not found (dlopen libcudnn.so.9: cannot open shared object file); fused attention "
           "runs stp's own CUDA kernel")
refused = ("stp: cuDNN fused attention refused B 2 T 2048 NH 14 NKV 2 D 256 bf16 with 0 bytes of workspace "
           "(x); this shape runs stp's own CUDA kernel")
def path(lines, attention="fused"):
    log = os.path.join(sys.argv[2], "attention.log")
    with open(log, "w") as f:
        f.write("$ stp train\nstep 1\n" + "".join(l + "\n" for l in lines))
    return gb.attention_path(["train.precision=bf16", f"model.attention={attention}"], log)
assert path([runs]) == ("cudnn", [runs]), path([runs])
assert path([missing]) == ("stp-kernel", [missing]), path([missing])
assert path([runs, refused]) == ("cudnn+stp-kernel", [runs, refused]), path([runs, refused])
assert path([]) == ("stp-kernel", []), path([])
assert path([runs], "naive") == ("naive", []), path([runs], "naive")
EOF
if [ -f "$json" ]; then
  python3 "$helper" check-schema "$json" || bad "dry run: result.json breaks the schema"
  python3 - "$json" <<'EOF' || bad "dry run: the rows' numbers"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["dry_run"] is True, r["dry_run"]
assert r["commit"], "no commit"
rows = {x["name"]: x for x in r["rows"]}
for name in ("stp-qwen2", "stp-gpt2-350m"):
    x = rows[name]
    assert x["status"] == "ok", (name, x["status"], x["reason"])
    assert x["tokens_per_s"] > 0 and x["step_ms"] > 0, x
    assert x["timed_steps"] == 2 and x["steps"] == 3, x
    assert x["launches_per_step"] > 0, x
    assert x["late_gemm_choices"] == 0, x  # every GEMM shape prepared at setup
    assert x["peak_device_bytes"] == x["planned_peak_device_bytes"] > 0, x  # the CPU backend is exact
    assert x["model_flops_per_token"] > 0 and x["mfu_vs_989"] > 0, x
    assert "parallel.backend=cpu" in x["settings"], x["settings"]
    # The default is the fused attention; the CPU backend has no library, so stp's own kernel ran.
    assert "model.attention=fused" in x["settings"], x["settings"]
    assert x["attention"] == "stp-kernel" and x["attention_log"] == [], (x["attention"], x["attention_log"])
for name in ("gemm-bf16", "torch-eager", "torch-compile"):
    x = rows[name]
    assert x["status"] in ("ok", "skipped"), (name, x)
    if x["status"] == "skipped":
        assert "does not import" in x["reason"], x["reason"]
    elif name != "gemm-bf16":
        assert x["tokens_per_step"] == rows["stp-qwen2"]["tokens_per_step"], x
if rows["torch-eager"]["status"] != "ok":
    assert r["ratios"]["stp_over_eager"] is None
EOF
  grep -q "^stp-qwen2 .* ok " "$tmp/dry.out" || bad "dry run: no table row for stp-qwen2"
else
  bad "dry run wrote no result.json"
fi

# A budget too small for the rows: they are reported as out of time, the JSON stays whole, status 1.
rc=0
STP_GPU_BENCH_BUDGET=4 STP_GPU_BENCH_DIR="$tmp/small" "$bench" --dry-run >"$tmp/small.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || bad "budget 4 s: status $rc, expected 1: $(tail -n 3 "$tmp/small.out")"
if [ -f "$tmp/small/result.json" ]; then
  python3 "$helper" check-schema "$tmp/small/result.json" || bad "budget 4 s: result.json breaks the schema"
  grep -q '"status": "timeout"' "$tmp/small/result.json" || bad "budget 4 s: no row reported as out of time"
else
  bad "budget 4 s: no result.json"
fi

# The GPU path with a fake nvidia-smi, one stp row at tiny shapes (so a machine with a real GPU
# and a CUDA build runs it in seconds too; without one the row fails with stp's own line): the
# device fields come from nvidia-smi, the JSON is whole, and a row that did not measure is status 1.
cat >"$tmp/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
if [ $# -eq 0 ]; then echo "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |"; exit 0; fi
echo "NVIDIA H100 80GB HBM3, 81559, 580.159.04"
SMI
rc=0
STP_NVIDIA_SMI="$tmp/nvidia-smi" STP_GPU_BENCH_DIR="$tmp/gpu" STP_GPU_BENCH_ROWS=stp-qwen2 STP_GPU_BENCH_STEPS=2 \
  STP_GPU_BENCH_WARMUP=1 STP_GPU_BENCH_SET="model.n_layer=2 model.n_embd=64 model.n_head=4 model.n_kv_head=2
  model.intermediate_size=128 model.vocab_size=512 model.seq_len=64 train.microbatches=2 memory.device_budget=1GiB" \
  "$bench" >"$tmp/gpu.out" 2>&1 || rc=$?
if [ -f "$tmp/gpu/result.json" ]; then
  python3 "$helper" check-schema "$tmp/gpu/result.json" || bad "fake GPU: result.json breaks the schema"
  python3 - "$tmp/gpu/result.json" "$rc" <<'EOF' || bad "fake GPU: $(tail -n 3 "$tmp/gpu.out")"
import json, sys
r, rc = json.load(open(sys.argv[1])), int(sys.argv[2])
d = r["device"]
assert r["dry_run"] is False
assert (d["name"], d["memory_mib"], d["driver"], d["cuda_driver"]) == ("NVIDIA H100 80GB HBM3", 81559, "580.159.04", "13.0"), d
rows = {x["name"]: x for x in r["rows"]}
assert rows["torch-eager"]["reason"] == "not in STP_GPU_BENCH_ROWS", rows["torch-eager"]
q = rows["stp-qwen2"]
assert "parallel.backend=cuda" in q["settings"] and "memory.device_budget=1GiB" in q["settings"], q["settings"]
assert (q["status"] == "ok") == (rc == 0), (q["status"], rc)
if q["status"] != "ok":
    assert q["reason"].startswith("exit status 1: stp train: error: "), q["reason"]
EOF
else
  bad "fake GPU: no result.json: $(tail -n 3 "$tmp/gpu.out")"
fi

# The schema check refuses a result with a row missing a key.
python3 - "$json" "$tmp/broken.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
del r["rows"][1]["launches_per_step"]
json.dump(r, open(sys.argv[2], "w"))
EOF
rc=0
python3 "$helper" check-schema "$tmp/broken.json" >"$tmp/broken.out" || rc=$?
[ "$rc" = 1 ] || bad "broken result accepted"
grep -q "launches_per_step" "$tmp/broken.out" || bad "broken result: the message names no key: $(cat "$tmp/broken.out")"

if ((failures)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "gpu-bench: every check passed"
