#!/usr/bin/env bash
# CTest: tools.gpu_stream_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# tools/gpu-stream without a GPU: with a missing nvidia-smi it stops at once with one clear line,
# status 1, and writes nothing; --dry-run runs both runs (streaming, then the unconstrained
# baseline at the largest depth that fits its budget) on the CPU backend at tiny shapes and writes
# result.json of the same schema as a GPU run, which the schema check accepts: both peaks equal
# their plans, the baseline is shallower than the streaming run (the dry budget holds 2 of its 4
# layers) with the same tokens per step, and the ratios are there; the schema check refuses a
# broken result.
set -euo pipefail
src="$1"
bin="$2"
tool="$src/tools/gpu-stream"
helper="$src/tools/gpu_stream.py"
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
[ -x "$bin/stp" ] || { echo "$bin/stp not built: skipped"; exit 77; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
bad() { echo "FAIL: $*"; failures=$((failures + 1)); }
export STP_GPU_STREAM_DIR="$tmp/out" STP_GPU_STREAM_BUILD_DIR="$bin"

rc=0
STP_NVIDIA_SMI="$tmp/missing/nvidia-smi" timeout 60 "$tool" >"$tmp/no-smi.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || bad "no nvidia-smi: status $rc, expected 1: $(cat "$tmp/no-smi.out")"
[ "$(wc -l <"$tmp/no-smi.out")" = 1 ] || bad "no nvidia-smi: expected one line: $(cat "$tmp/no-smi.out")"
grep -q '^gpu-stream: error: no NVIDIA GPU here' "$tmp/no-smi.out" || bad "no nvidia-smi: $(cat "$tmp/no-smi.out")"
[ ! -e "$tmp/out" ] || bad "no nvidia-smi: wrote $tmp/out"

rc=0
"$tool" --bogus >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || bad "unknown option: status $rc, expected 2"
"$tool" --help >"$tmp/help.out" 2>&1 || bad "--help: status $?"
grep -q -- "--dry-run" "$tmp/help.out" || bad "--help does not document --dry-run"

start=$SECONDS
rc=0
"$tool" --dry-run >"$tmp/dry.out" 2>&1 || rc=$?
cat "$tmp/dry.out"
[ "$rc" = 0 ] || bad "dry run: status $rc"
((SECONDS - start <= 60)) || bad "dry run took $((SECONDS - start)) s"
json="$tmp/out/result.json"
if [ -f "$json" ]; then
  python3 "$helper" check-schema "$json" || bad "dry run: result.json breaks the schema"
  python3 - "$json" <<'PY' || bad "dry run: the runs' numbers"
import json, sys
r = json.load(open(sys.argv[1]))
stream, base = r["runs"]
assert r["schema"] == "stp-gpu-stream/1" and r["dry_run"] is True
for run in (stream, base):
    assert run["status"] == "ok", run
    assert run["peak_equals_plan"] is True, (run["name"], run["peak_device_bytes"], run["planned_peak_device_bytes"])
    assert run["timed_steps"] == 2 and run["steps"] == 3, run
assert stream["plan"]["param_stream"] == [True] and stream["plan"]["optimizer"] == ["host"], stream["plan"]
assert base["plan"]["param_stream"] == [False] and base["plan"]["optimizer"] == ["device"], base["plan"]
assert stream["n_layer"] == 4 and base["n_layer"] == 2, (stream["n_layer"], base["n_layer"])
assert stream["tokens_per_step"] == base["tokens_per_step"]
for k, v in r["ratios"].items():
    assert isinstance(v, float) and v > 0, (k, v)
PY
  grep -q '^stream .* = ' "$tmp/dry.out" || bad "the table shows no 'peak = plan' for the streaming run"
  # No run reached its end-of-run checkpoint: each was stopped once its steps were logged.
  ls -d "$tmp"/out/runs/*/checkpoint-* >/dev/null 2>&1 && bad "a run wrote a checkpoint"
  # The schema check refuses a broken result.
  python3 - "$json" "$tmp/broken.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
del r["runs"][1]["peak_equals_plan"]
json.dump(r, open(sys.argv[2], "w"))
PY
  rc=0
  python3 "$helper" check-schema "$tmp/broken.json" >"$tmp/broken.out" || rc=$?
  [ "$rc" = 1 ] || bad "check-schema accepted a run without peak_equals_plan"
  grep -q "missing key 'peak_equals_plan'" "$tmp/broken.out" || bad "check-schema: $(cat "$tmp/broken.out")"
else
  bad "dry run wrote no result.json"
fi

((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
echo "gpu_stream_test: ok"
