#!/usr/bin/env bash
# CTest: tools.gpu_check_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# tools/gpu-check without a GPU (always through a fake or missing nvidia-smi, so this test behaves
# the same on a GPU machine): it stops at once with one clear line, status 1, and writes nothing;
# --detect-only reports what it found and chose. Then the helpers that read CTest's and stp's
# results (tools/gpu_check.py) on small inputs whose answers are known.
set -euo pipefail
src="$1"
bin="${2:-}"
check="$src/tools/gpu-check"
helper="$src/tools/gpu_check.py"
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
bad() { echo "FAIL: $*"; failures=$((failures + 1)); }

export STP_GPU_CHECK_DIR="$tmp/out" STP_GPU_CHECK_BUILD_DIR="$tmp/build"
repo_runs_existed=0
[ -e "$src/runs/gpu-check" ] && repo_runs_existed=1

# expect_one_line NAME NEEDLE [gpu-check args]: status 1 within 10 s, exactly one output line
# (stdout + stderr) holding NEEDLE, and no output folder or build folder created.
expect_one_line() {
  local name=$1 needle=$2
  shift 2
  local start=$SECONDS rc=0
  timeout 60 "$check" "$@" >"$tmp/$name.out" 2>&1 || rc=$?
  local lines
  lines=$(wc -l <"$tmp/$name.out")
  [ "$rc" = 1 ] || bad "$name: status $rc, expected 1: $(cat "$tmp/$name.out")"
  [ "$lines" = 1 ] || bad "$name: $lines lines, expected one: $(cat "$tmp/$name.out")"
  grep -qF -- "$needle" "$tmp/$name.out" || bad "$name: '$needle' not in: $(cat "$tmp/$name.out")"
  grep -q '^gpu-check: error: ' "$tmp/$name.out" || bad "$name: not a 'gpu-check: error:' line: $(cat "$tmp/$name.out")"
  ((SECONDS - start <= 10)) || bad "$name: took $((SECONDS - start)) s, expected at once"
  [ ! -e "$tmp/out" ] || bad "$name: wrote $tmp/out"
  [ ! -e "$tmp/build" ] || bad "$name: created the build folder"
}

fake() {  # fake nvidia-smi: prints $2 (backslash escapes expanded) and exits with status $1
  printf '%b' "$2" >"$tmp/nvidia-smi.txt"
  printf '#!/usr/bin/env bash\ncat "%s"\nexit %d\n' "$tmp/nvidia-smi.txt" "$1" >"$tmp/nvidia-smi"
  chmod +x "$tmp/nvidia-smi"
}

STP_NVIDIA_SMI="$tmp/missing/nvidia-smi" expect_one_line no-smi "no NVIDIA GPU here: '$tmp/missing/nvidia-smi' was not found"
fake 9 "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n\n"
STP_NVIDIA_SMI="$tmp/nvidia-smi" expect_one_line no-driver "couldn't communicate with the NVIDIA driver"
fake 6 "No devices were found\n"
STP_NVIDIA_SMI="$tmp/nvidia-smi" expect_one_line no-devices "No devices were found"
fake 0 ""
STP_NVIDIA_SMI="$tmp/nvidia-smi" expect_one_line empty-list "lists none"
# On this machine the real nvidia-smi decides: with no GPU the plain command stops the same way.
if ! command -v nvidia-smi >/dev/null 2>&1; then expect_one_line plain "no NVIDIA GPU here"; fi

rc=0
"$check" --bogus >"$tmp/usage.out" 2>&1 || rc=$?
[ "$rc" = 2 ] || bad "unknown option: status $rc, expected 2"

# --detect-only with two H100s: peak from the table, layout tp=1 pp=2, nothing written.
fake 0 "0, NVIDIA H100 80GB HBM3, 81559, 550.54.15\n1, NVIDIA H100 80GB HBM3, 81559, 550.54.15\n"
out="$(STP_NVIDIA_SMI="$tmp/nvidia-smi" "$check" --detect-only 2>&1)" || bad "detect-only H100: status $?: $out"
for needle in "2 GPU(s): NVIDIA H100 80GB HBM3, 81559 MiB" "FP32 67 TFLOPS, BF16 dense 989.4 TFLOPS" "tp=1 pp=2"; do
  grep -qF "$needle" <<<"$out" || bad "detect-only H100: '$needle' not in: $out"
done
[ ! -e "$tmp/out" ] || bad "detect-only wrote $tmp/out"
# Eight GPUs of an unknown kind: no peak unless STP_PEAK_TFLOPS; layout tp=2 pp=4.
fake 0 "$(for i in 0 1 2 3 4 5 6 7; do printf '%s, Future GPU, 1000, 999.1\\n' "$i"; done)"
out="$(STP_NVIDIA_SMI="$tmp/nvidia-smi" "$check" --detect-only 2>&1)" || bad "detect-only unknown: status $?: $out"
grep -qF "FP32 unknown (set STP_PEAK_TFLOPS" <<<"$out" || bad "unknown GPU: no hint to set STP_PEAK_TFLOPS: $out"
grep -qF "tp=2 pp=4" <<<"$out" || bad "8 GPUs: layout: $out"
out="$(STP_PEAK_TFLOPS=123.5 STP_NVIDIA_SMI="$tmp/nvidia-smi" "$check" --detect-only 2>&1)" || bad "STP_PEAK_TFLOPS: status $?"
grep -qF "FP32 123.5 TFLOPS" <<<"$out" || bad "STP_PEAK_TFLOPS ignored: $out"
rc=0
STP_PEAK_TFLOPS=fast STP_NVIDIA_SMI="$tmp/nvidia-smi" "$check" --detect-only >/dev/null 2>&1 || rc=$?
[ "$rc" = 1 ] || bad "STP_PEAK_TFLOPS=fast accepted"
rc=0
STP_GPU_CHECK_TP=4 STP_GPU_CHECK_PP=4 STP_NVIDIA_SMI="$tmp/nvidia-smi" "$check" --detect-only >"$tmp/tp.out" 2>&1 || rc=$?
if [ "$rc" != 1 ] || ! grep -qF "needs 16 GPUs, this machine has 8" "$tmp/tp.out"; then
  bad "tp x pp above the GPU count accepted: $(cat "$tmp/tp.out")"
fi

if [ "$repo_runs_existed" = 0 ] && [ -e "$src/runs/gpu-check" ]; then bad "wrote $src/runs/gpu-check"; fi

# ---- tools/gpu_check.py ----------------------------------------------------------------------
[ "$(python3 "$helper" flops 24 1024 256 1024)" = 2115502080 ] || bad "flops: $(python3 "$helper" flops 24 1024 256 1024)"
[ "$(python3 "$helper" peak "NVIDIA A100-SXM4-80GB")" = "19.5 312" ] || bad "peak A100"
[ "$(python3 "$helper" peak "NVIDIA L4")" = "30.3 121" ] || bad "peak L4 (must not match L40)"
[ "$(python3 "$helper" peak "NVIDIA H100 PCIe")" = "51.2 756" ] || bad "peak H100 PCIe"

junit() {  # junit FILE then "name|status|output" lines
  local f=$1
  shift
  { echo '<?xml version="1.0" encoding="UTF-8"?>'; echo '<testsuite name="stp">'
    for c in "$@"; do
      IFS='|' read -r n st o <<<"$c"
      echo "<testcase name=\"$n\" classname=\"$n\" time=\"0.1\" status=\"$st\">"
      [ "$st" = fail ] && echo '<failure message=""/>'
      [ "$st" = notrun ] && echo '<skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>'
      printf '<system-out>%b</system-out>\n</testcase>\n' "$o"
    done
    echo '</testsuite>'; } >"$f"
}
ok_cases=("Backends/OnDevice.Launch/cpu|run|[       OK ]"
          "Backends/OnDevice.Launch/cuda  # GetParam() = 4-byte object &lt;01-00 00-00&gt;|run|[       OK ]"
          "Backends/OnDevice.AllReduce/cuda  # GetParam() = 4-byte object &lt;01-00 00-00&gt;|notrun|x.cpp:1: Skipped\nno usable cuda device here: 1 GPU(s) visible, 2 needed (one per rank)\n[  SKIPPED ]"
          "CudaBackend.WithoutAUsableGpu|notrun|x.cpp:2: Skipped\na GPU is usable here\n[  SKIPPED ]"
          "CmdTrain.TruncatedCheckpoint|notrun|x.cpp:3: Skipped\nstp not built\n[  SKIPPED ]")
junit "$tmp/ok.xml" "${ok_cases[@]}"
python3 "$helper" ctest "$tmp/ok.xml" 1 >"$tmp/ok.md" || bad "ctest: legitimate skips rejected: $(cat "$tmp/ok.md")"
grep -qF "5 tests: 2 passed, 0 failed, 3 skipped." "$tmp/ok.md" || bad "ctest counts: $(cat "$tmp/ok.md")"
# CTest names parameterised cases "…/cuda  # GetParam() = …": they must count as CUDA cases.
grep -qF "CUDA cases (3)" "$tmp/ok.md" || bad "ctest: CUDA cases not recognised: $(cat "$tmp/ok.md")"
grep -qF "needs 2 GPUs, this machine has 1" "$tmp/ok.md" || bad "ctest: needs-more-GPUs verdict missing"
junit "$tmp/more.xml" "${ok_cases[@]}"
python3 "$helper" ctest "$tmp/more.xml" 2 >"$tmp/more.md" && bad "ctest: a 2-GPU case skipped on a 2-GPU machine was accepted"
junit "$tmp/driver.xml" "Backends/OnDevice.Launch/cuda  # GetParam() = 4-byte object &lt;01-00 00-00&gt;|notrun|no usable cuda device here: no NVIDIA driver was found\n[  SKIPPED ]"
python3 "$helper" ctest "$tmp/driver.xml" 1 >"$tmp/driver.md" && bad "ctest: a CUDA case skipped for want of a driver was accepted"
grep -qF "FAILED: skipped on a machine with 1 GPU(s)" "$tmp/driver.md" || bad "ctest: verdict: $(cat "$tmp/driver.md")"
junit "$tmp/fail.xml" "Backends/OnDevice.Launch/cuda|run|ok" "OffloadEngine.Roundtrip|fail|boom"
python3 "$helper" ctest "$tmp/fail.xml" 1 >/dev/null && bad "ctest: a failed test was accepted"
# The kernel parity and backend training cases (tests/core/kernel_parity_test.cpp,
# tests/train/backend_training_test.cpp) are named LAYOUT/SUITE.TEST/KIND: the cuda ones are CUDA
# cases (a 4-GPU layout may be skipped on 2 GPUs), the cpu ones are not (their parameter names the
# layout, not the backend).
junit "$tmp/named.xml" "Backends/KernelParity.Gemm/cuda  # GetParam() = 4-byte object &lt;01-00 00-00&gt;|run|[parity] C: max abs error 1e-06\n[       OK ]" \
  "Backends/KernelParity.Gemm/cpu  # GetParam() = 4-byte object &lt;00-00 00-00&gt;|run|[       OK ]" \
  "tp1_pp1_gpipe/BackendTraining.MatchesTheCpuBackend/cuda  # GetParam() = cuda tp=1 pp=1 gpipe|run|[       OK ]" \
  "tp2_pp2_stp/BackendTraining.BudgetHoldsAsPlanned/cuda  # GetParam() = cuda tp=2 pp=2 stp|notrun|x.cpp:4: Skipped\nno usable cuda device here: 2 GPU(s) visible, 4 needed (one per rank)\n[  SKIPPED ]" \
  "tp2_pp2_stp/BackendTraining.BudgetHoldsAsPlanned/cpu  # GetParam() = cpu tp=2 pp=2 stp|run|[       OK ]"
python3 "$helper" ctest "$tmp/named.xml" 2 >"$tmp/named.md" || bad "ctest: parity/training cases rejected: $(cat "$tmp/named.md")"
grep -qF "CUDA cases (3)" "$tmp/named.md" || bad "ctest: parity/training cases miscounted: $(cat "$tmp/named.md")"
grep -qF '`tp2_pp2_stp/BackendTraining.BudgetHoldsAsPlanned/cuda` | skipped | ok: needs 4 GPUs' "$tmp/named.md" ||
  bad "ctest: 4-GPU training case verdict: $(cat "$tmp/named.md")"
junit "$tmp/nocuda.xml" "Backends/OnDevice.Launch/cpu|run|ok"
python3 "$helper" ctest "$tmp/nocuda.xml" 1 >/dev/null && bad "ctest: results without any CUDA case were accepted"

printf '%s\n' '{"step":1,"loss":5.000000,"lr":1e-3,"step_ms":900.0,"tokens_per_s":100.0,"peak_device_bytes":[10,30],"peak_host_pinned_bytes":0}' \
  '{"step":2,"loss":4.000000,"lr":1e-3,"step_ms":500.0,"tokens_per_s":200.0,"peak_device_bytes":[10,20],"peak_host_pinned_bytes":0}' \
  '{"step":3,"loss":3.000000,"lr":1e-3,"step_ms":100.0,"tokens_per_s":1000.0,"peak_device_bytes":[10,20],"peak_host_pinned_bytes":5,"offload":{"d2h_bytes":[4,6],"h2d_bytes":[4,6],"d2h_GBps":[12.5,0],"h2d_GBps":[1,1],"stall_ms":[0.5,0.25]}}' \
  '{"step":4,"loss":2.000000,"lr":1e-3,"step_ms":300.0,"tokens_per_s":300.0,"peak_device_bytes":[10,20],"peak_host_pinned_bytes":5,"offload":{"d2h_bytes":[4,6],"h2d_bytes":[4,6],"d2h_GBps":[12.5,0],"h2d_GBps":[1,1],"stall_ms":[0.5,0.25]}}' \
  >"$tmp/ref.jsonl"
sum="$(python3 "$helper" summary "$tmp/ref.jsonl" 2)"
want='{"steps": 4, "timed_steps": 2, "step_ms": 200.0, "tokens_per_s": 650.0, "peak_device_bytes": 30, "peak_host_pinned_bytes": 5, "last_loss": 2.0, "d2h_bytes_per_step": 10.0, "h2d_bytes_per_step": 10.0, "stall_ms_per_step": 0.75, "d2h_GBps": 12.5}'
[ "$sum" = "$want" ] || bad "summary: $sum"
sed 's/"loss":3.000000/"loss":3.002000/' "$tmp/ref.jsonl" >"$tmp/got.jsonl"
python3 "$helper" losses "$tmp/ref.jsonl" "$tmp/got.jsonl" 1e-3 >"$tmp/l1.md" || bad "losses: 6.7e-4 relative rejected at 1e-3: $(cat "$tmp/l1.md")"
python3 "$helper" losses "$tmp/ref.jsonl" "$tmp/got.jsonl" 1e-4 >/dev/null && bad "losses: 6.7e-4 relative accepted at 1e-4"
echo '{"feasible":true,"min_device_budget":7,"ranks":[{"rank":0,"peak_device_bytes":11,"host_pinned_bytes":3},{"rank":1,"peak_device_bytes":42,"host_pinned_bytes":0}]}' >"$tmp/plan.json"
[ "$(python3 "$helper" plan "$tmp/plan.json")" = '{"feasible": true, "min_device_budget": 7, "peak_device_bytes": 42, "host_pinned_bytes": 3}' ] ||
  bad "plan: $(python3 "$helper" plan "$tmp/plan.json")"
printf '0, 1200\n1, 80500\n0, 900\n' >"$tmp/smi.log"
[ "$(python3 "$helper" smi-max "$tmp/smi.log")" = 80500 ] || bad "smi-max"

# --help lists what a fresh GPU machine needs and how to use a build prepared elsewhere.
help="$("$check" --help)" || bad "--help: status $?"
for needle in "What a fresh GPU machine needs" "NCCL 2.26 or later" "CMake 3.25 or later" "NCCL_ROOT or NCCL_HOME" \
  "libnccl2 libnccl-dev" "Without a package registry" "STP_GPU_CHECK_SKIP_BUILD=1 tools/gpu-check" "ldd build-gpu/stp"; do
  grep -qF -- "$needle" <<<"$help" || bad "--help does not say '$needle'"
done

# Build prerequisites: an old CMake, no nvcc, an old NCCL in NCCL_ROOT: one line each, status 1.
mkdir -p "$tmp/pre/bin" "$tmp/pre/nccl/include" "$tmp/pre/cuda"
printf '#!/bin/sh\necho "cmake version 3.22.1"\n' >"$tmp/pre/bin/cmake"
chmod +x "$tmp/pre/bin/cmake"
printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 18\n#define NCCL_PATCH 5\n' >"$tmp/pre/nccl/include/nccl.h"
py="$(python3 -c 'import sys; print(sys.executable)')"
rc=0
PATH="$tmp/pre/bin" CUDA_HOME="$tmp/pre/cuda" NCCL_ROOT="$tmp/pre/nccl" "$py" "$helper" prereqs >"$tmp/pre.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || bad "prereqs: status $rc with everything missing"
[ "$(wc -l <"$tmp/pre.out")" = 3 ] || bad "prereqs: expected 3 lines: $(cat "$tmp/pre.out")"
for needle in "CMake 3.22.1 is too old: stp needs 3.25 or later" "nvcc is missing" "NCCL 2.18.5" "needs NCCL 2.26 or later"; do
  grep -qF "$needle" "$tmp/pre.out" || bad "prereqs: '$needle' not in: $(cat "$tmp/pre.out")"
done
printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 3\n' >"$tmp/pre/nccl/include/nccl.h"
printf '#!/bin/sh\necho "cmake version 3.28.3"\n' >"$tmp/pre/bin/cmake"
printf '#!/bin/sh\n' >"$tmp/pre/bin/nvcc"
chmod +x "$tmp/pre/bin/nvcc"
PATH="$tmp/pre/bin" CUDA_HOME="$tmp/pre/cuda" NCCL_ROOT="$tmp/pre/nccl" "$py" "$helper" prereqs >"$tmp/pre2.out" 2>&1 ||
  bad "prereqs: a complete machine rejected: $(cat "$tmp/pre2.out")"

# Two JUnit files (CPU cases in parallel, CUDA cases one at a time) are read as one result.
junit "$tmp/cpu-part.xml" "Backends/OnDevice.Launch/cpu|run|ok"
junit "$tmp/cuda-part.xml" "Backends/OnDevice.Launch/cuda|run|ok"
python3 "$helper" ctest "$tmp/cpu-part.xml,$tmp/cuda-part.xml" 1 >"$tmp/two.md" || bad "ctest: two files rejected: $(cat "$tmp/two.md")"
grep -qF "2 tests: 2 passed" "$tmp/two.md" || bad "ctest: two files not merged: $(cat "$tmp/two.md")"

# predict: the plan's prediction against a run's medians (warm-up 1: steps 2..4 timed).
echo '{"cost_model":{"source":"CPU backend nominal"},"ranks":[{"compute_s":0.1,"predicted_step_cost":0.05,"exposed_copy_s":0.02},{"compute_s":0.2,"predicted_step_cost":0.0,"exposed_copy_s":0.0}]}' >"$tmp/pplan.json"
sed -e 's/"peak_host_pinned_bytes":0}/"peak_host_pinned_bytes":0,"late_gemm_choices":[1,0]}/' \
    -e 's/"stall_ms":\[0.5,0.25\]}}/"stall_ms":[0.5,0.25]},"late_gemm_choices":[0,0]}/' "$tmp/ref.jsonl" >"$tmp/late.jsonl"
row="$(python3 "$helper" predict run "$tmp/pplan.json" "$tmp/late.jsonl" 1 "$tmp/pred.json")" || bad "predict: status $?: $row"
[ "$row" = "| run | 200.0 | 300.0 | 1.50 | 20.0 | 0.5 | 0.03 | CPU backend nominal |" ] || bad "predict row: $row"
python3 - "$tmp/pred.json" <<'EOF2' || bad "predict JSON: $(cat "$tmp/pred.json")"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["predicted_step_s"] == 0.2 and abs(p["measured_step_s"] - 0.3) < 1e-12, p
assert abs(p["step_ratio"] - 1.5) < 1e-12 and p["predicted_exposed_copy_s"] == 0.02, p
assert abs(p["measured_exposed_copy_s"] - 0.0005) < 1e-12 and abs(p["exposed_copy_ratio"] - 0.025) < 1e-12, p
assert p["timed_steps"] == 3 and p["cost_model"]["source"] == "CPU backend nominal", p
EOF2
[ "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["late_gemm_choices"])' "$(python3 "$helper" summary "$tmp/late.jsonl" 2)")" = 2 ] ||
  bad "summary: late GEMM choices not summed over every step"

# --dry-run: stage 7 on the CPU backend with the build under test, no GPU asked for.
if [ -n "$bin" ] && [ -x "$bin/stp" ]; then
  rc=0
  STP_NVIDIA_SMI="$tmp/missing/nvidia-smi" STP_GPU_CHECK_DIR="$tmp/dry" STP_GPU_CHECK_BUILD_DIR="$bin" \
    timeout 600 "$check" --dry-run >"$tmp/dry.out" 2>&1 || rc=$?
  [ "$rc" = 0 ] || bad "dry run: status $rc: $(cat "$tmp/dry.out"; cat "$tmp/dry/report.md" 2>/dev/null)"
  grep -qF "## 6. The planner's cost model against the run" "$tmp/dry/report.md" 2>/dev/null || bad "dry run: no stage 7 in the report"
  python3 - "$tmp/dry/result.json" <<'EOF2' || bad "dry run: result.json: $(cat "$tmp/dry/result.json" 2>/dev/null)"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["schema"] == "stp-gpu-check/1" and r["dry_run"] is True and r["passed"] is True, r
p = {x["name"]: x for x in r["predictions"]}
assert sorted(p) == ["tiny", "tiny-offload"], sorted(p)
for x in p.values():
    assert x["predicted_step_s"] > 0 and x["measured_step_s"] > 0 and x["step_ratio"] > 0, x
    assert x["timed_steps"] == 3 and x["cost_model"]["source"].startswith("CPU backend"), x
assert p["tiny"]["predicted_exposed_copy_s"] == 0 and p["tiny"]["measured_exposed_copy_s"] == 0, p["tiny"]
assert p["tiny"]["exposed_copy_ratio"] is None, p["tiny"]
assert "memory.link_bandwidth" in p["tiny-offload"]["cost_model"]["source"], p["tiny-offload"]
assert p["tiny-offload"]["predicted_exposed_copy_s"] >= 0 and p["tiny-offload"]["measured_exposed_copy_s"] >= 0, p
# Every GEMM shape prepared at setup: no step chose an algorithm.
assert r["late_gemm_choices"] == {"tiny": 0, "tiny-offload": 0}, r["late_gemm_choices"]
EOF2
else
  echo "no stp in '$bin': the dry run of tools/gpu-check is not tested"
fi

if ((failures)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "gpu-check: no-GPU exits, detection, and result readers behave"
