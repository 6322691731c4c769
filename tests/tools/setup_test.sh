#!/usr/bin/env bash
# CTest: tools.setup_test SOURCE_DIR BINARY_DIR CUDA_ENABLED
# tools/setup.sh's choice of the CUDA backend, run against fakes of nvidia-smi, cmake and
# dpkg-query placed first on PATH (so nothing is installed, configured or built): without a
# visible GPU it configures with -DSTP_CUDA=OFF; with GPUs, for their architectures only (or
# "native" when the driver cannot say); STP_CUDA=ON builds every configured architecture and
# STP_CUDA=OFF none; a -DSTP_CUDA= option of the caller (tools/test.sh, tools/gpu-check) wins.
set -euo pipefail
src="$1"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
cat >"$tmp/bin/cmake" <<'EOF'
#!/usr/bin/env bash
printf '%s\n' "$*" >>"$FAKE_LOG"
echo "-- stp: fake cmake"
EOF
cat >"$tmp/bin/dpkg-query" <<'EOF'
#!/usr/bin/env bash
printf 'install ok installed'
EOF
# nvidia-smi as FAKE_GPUS says: "" = no driver (fails), "none" = no device, else the compute
# capabilities, one per GPU ("9.0 8.0"), or "old:N" = N GPUs and a driver without compute_cap.
cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$FAKE_GPUS" in
  "") echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" >&2; exit 9 ;;
  none) echo "No devices were found"; exit 6 ;;
esac
if [[ "$FAKE_GPUS" == old:* ]]; then
  [ "$1" = -L ] || { echo "Field \"compute_cap\" is not a valid field to query." >&2; exit 2; }
  for ((i = 0; i < ${FAKE_GPUS#old:}; i++)); do echo "GPU $i: NVIDIA A100 (UUID: GPU-$i)"; done
  exit 0
fi
i=0
for cap in $FAKE_GPUS; do
  if [ "$1" = -L ]; then echo "GPU $i: NVIDIA H200 (UUID: GPU-$i)"; else echo "$cap"; fi
  i=$((i + 1))
done
EOF
chmod +x "$tmp/bin"/*

failures=0
# run NAME EXPECTED_STATUS [VAR=VALUE...] -- [setup.sh arguments]: runs setup.sh; the configure
# line (the first cmake call) is left in $configure.
run() {
  local name="$1" expected="$2" status=0
  shift 2
  local env=()
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  rm -f "$tmp/cmake.log"
  env PATH="$tmp/bin:$PATH" FAKE_LOG="$tmp/cmake.log" STP_BUILD_DIR="$tmp/build" STP_JOBS=1 "${env[@]}" \
    bash "$src/tools/setup.sh" "$@" >"$tmp/out" 2>&1 || status=$?
  configure="$(head -n 1 "$tmp/cmake.log" 2>/dev/null || true)"
  if [ "$status" -ne "$expected" ]; then
    echo "FAIL: $name: status $status, expected $expected:"; cat "$tmp/out"; failures=$((failures + 1)); return 1
  fi
}
has() {  # NAME TEXT: the configure line holds TEXT
  grep -qF -- "$2" <<<"$configure" || { echo "FAIL: $1: no '$2' in: cmake $configure"; failures=$((failures + 1)); }
}
lacks() {  # NAME TEXT: the configure line does not hold TEXT
  if grep -qF -- "$2" <<<"$configure"; then echo "FAIL: $1: '$2' in: cmake $configure"; failures=$((failures + 1)); fi
}

if run "no driver" 0 FAKE_GPUS= STP_CUDA= --; then
  has "no driver" "-DSTP_CUDA=OFF"; lacks "no driver" "STP_CUDA_ARCHITECTURES"
fi
if run "no device" 0 FAKE_GPUS=none --; then has "no device" "-DSTP_CUDA=OFF"; fi
if run "three GPUs of two kinds" 0 FAKE_GPUS="9.0 8.0 9.0" --; then
  has "three GPUs of two kinds" "-DSTP_CUDA=AUTO"; has "three GPUs of two kinds" "-DSTP_CUDA_ARCHITECTURES=80;90"
  grep -qF "visible" "$tmp/out" || { echo "FAIL: three GPUs of two kinds: setup.sh did not say what it chose"; failures=$((failures + 1)); }
fi
if run "Blackwell" 0 FAKE_GPUS="10.0" --; then has "Blackwell" "-DSTP_CUDA_ARCHITECTURES=100"; fi
if run "old driver" 0 FAKE_GPUS="old:2" --; then has "old driver" "-DSTP_CUDA_ARCHITECTURES=native"; fi
if run "STP_CUDA=ON" 0 FAKE_GPUS= STP_CUDA=ON --; then
  has "STP_CUDA=ON" "-DSTP_CUDA=ON"; has "STP_CUDA=ON" "-USTP_CUDA_ARCHITECTURES"
fi
if run "STP_CUDA=on, a GPU" 0 FAKE_GPUS="9.0" STP_CUDA=on --; then
  has "STP_CUDA=on, a GPU" "-DSTP_CUDA=ON"; lacks "STP_CUDA=on, a GPU" "-DSTP_CUDA_ARCHITECTURES="
fi
if run "STP_CUDA=ON, architectures given" 0 FAKE_GPUS= STP_CUDA=ON -- -DSTP_CUDA_ARCHITECTURES=90; then
  lacks "STP_CUDA=ON, architectures given" "-USTP_CUDA_ARCHITECTURES"
fi
if run "STP_CUDA=OFF, a GPU" 0 FAKE_GPUS="9.0" STP_CUDA=OFF --; then
  has "STP_CUDA=OFF, a GPU" "-DSTP_CUDA=OFF"; lacks "STP_CUDA=OFF, a GPU" "ARCHITECTURES"
fi
if run "the caller's -DSTP_CUDA" 0 FAKE_GPUS= -- --all -DSTP_WERROR=ON -DSTP_CUDA=AUTO; then
  has "the caller's -DSTP_CUDA" "-DSTP_CUDA=AUTO"; lacks "the caller's -DSTP_CUDA" "-DSTP_CUDA=OFF"
  lacks "the caller's -DSTP_CUDA" "ARCHITECTURES"
fi
run "STP_CUDA=maybe" 2 FAKE_GPUS= STP_CUDA=maybe -- || true
[ -s "$tmp/cmake.log" ] && { echo "FAIL: STP_CUDA=maybe still ran cmake"; failures=$((failures + 1)); }

if [ "$failures" -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "setup_test: tools/setup.sh chose the CUDA backend as documented in 11 cases"
