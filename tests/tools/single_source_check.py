#!/usr/bin/env python3
"""Proves that every device functor is single-source: the code the CPU tests run is the code the
GPU runs (docs/gpu-readiness.md, Kernels: single source). Run by CTest as tools.single_source_test
in every build; the object-file checks need the build's objects (CTest runs after the build).

Source rules (every build):
  S1  a file that defines an STP_HD functor or calls launch() is named *_kernels.cpp (CMake then
      compiles it with nvcc when the CUDA backend is on), except the listed EXCEPTIONS;
  S2  no hand-written device code anywhere else: `__global__` and `<<<` appear only in
      core/launch.h (its generic kernel runs every functor, its block kernel every block program);
  S3  each functor name is defined once across the kernel files (one definition of the math);
  S4  every *_kernels.cpp is compiled into some target (it is in compile_commands.json);
  S5  no file in core/kernels/ tests the device kind (DeviceKind, .kind(), the launch layer's own
      launch_detail test): a kernel names its launch shape and core/launch_shape.h lays it out for
      the stream's backend.
Object rules (every build; the object is the one in the build tree):
  O1  for every functor F, its object holds the CPU path of launch<F> (the oneTBB task body), or of
      launch_blocks<Threads, F> for a block program (core/launch.h);
CUDA builds only:
  C1  every *_kernels.cpp is compiled by nvcc as CUDA (`-x cu` in compile_commands.json);
  C2  its object holds a device kernel for every functor F (the __device_stub__ of
      stp_generic_kernel<F>, or stp_block_kernel<Threads, F> for a block program) and a .nv_fatbin section — the same object as O1, so one functor
      type, one translation unit, two dispatch paths;
  C3  the library objects (core/kernels/*) are members of libstp_core.a, the library every CPU
      test suite links.
Exit 0 = all rules hold, 1 = a rule is broken (each violation printed), 2 = usage.
"""
import json
import os
import re
import shutil
import subprocess
import sys

SCAN_DIRS = ["core", "memory", "offload", "models", "train", "schedule", "tools", "tests"]
SCAN_EXT = (".cpp", ".h", ".cu", ".cuh", ".hpp", ".cc")
# Files allowed to mention STP_HD / launch() without being compiled by nvcc, and why.
EXCEPTIONS = {
    "core/launch.h": "defines launch() and launch_blocks() and their CUDA kernels (generic and block)",
    "core/launch_shape.h": "the launch shapes: their STP_HD part() and launch(stream, shape, f), included by the "
                           "*_kernels.cpp files (compiled there)",
    "core/reduce_order.h": "the reduction shapes' canonical order (STP_HD helpers, no functor), included by "
                           "core/launch_shape.h (compiled in the *_kernels.cpp files)",
    "core/dtype.h": "defines STP_HD and the bf16 load/store functions the functors call (no functor)",
    "core/cpu/cpu_launch.cpp": "the CPU backend's entry point behind launch() (no functor)",
    "tools/bench/bench_runtime.cpp": "CPU-only benchmark: its Noop functor is launched on a CpuDevice only",
    "core/kernels/attention_tiles.h": "tile walks included by the attention *_kernels.cpp files (compiled there)",
    "core/kernels/norm_rows.h": "row helpers included by the norm *_kernels.cpp files (compiled there)",
    "core/kernels/exp_nonpositive.h": "the softmax exponential, included by the attention and cross-entropy "
                                      "*_kernels.cpp files (compiled there)",
    "core/kernels/softmax_rows.h": "row helpers included by the cross-entropy *_kernels.cpp files (compiled there)",
    "core/kernels/adamw_ranges.h": "adamw_element, included by optim_kernels.cpp (compiled there); its host "
    "ranges (adamw_ranges.cpp) are called under !__CUDA_ARCH__ only",
    "core/kernels/activation_rows.h": "GELU and SwiGLU runs included by nn_kernels.cpp and llama_kernels.cpp (compiled there)",
    "core/kernels/activation_rows_avx2.cpp": "the AVX2 + FMA host forms of activation_rows.h's f32 runs, called under "
    "!__CUDA_ARCH__ only, so no device code exists for them",
    "core/kernels/softmax_rows_avx2.cpp": "the AVX2 + FMA host forms of softmax_rows.h's f32 row passes, called "
                                          "under !__CUDA_ARCH__ only, so no device code exists for them",
    "core/kernels/attention_kernels_avx2.cpp": "the AVX2 + FMA host path: attention_kernels.cpp calls it from host "
                                               "code on CPU streams only, so no device code exists for it",
}

# S5: how a kernel would test the stream's backend.
DEVICE_KIND_TEST = re.compile(r"\bDeviceKind\b|(?:\.|->)\s*kind\s*\(\s*\)|\blaunch_detail\b")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: " " + "\n" * m.group(0).count("\n"), text, flags=re.S)  # keeps line numbers
    return re.sub(r"//[^\n]*", "", text)


def source_files(src):
    for d in SCAN_DIRS:
        root = os.path.join(src, d)
        for dirpath, _, names in os.walk(root):
            for n in names:
                if n.endswith(SCAN_EXT):
                    path = os.path.join(dirpath, n)
                    yield os.path.relpath(path, src), path


def functors(code):
    """Names of structs whose body declares an STP_HD operator()."""
    out = []
    for m in re.finditer(r"\bstruct\s+(\w+)\s*(?::[^{;]*)?\{", code):
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        body = code[m.end():i]
        if re.search(r"STP_HD[^;{]*operator\s*\(\s*\)", body):
            out.append(m.group(1))
    return out


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main():
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    if set(args) != {"--source", "--build", "--cuda"}:
        print("usage: single_source_check.py --source DIR --build DIR --cuda ON|OFF", file=sys.stderr)
        return 2
    src, build, cuda = args["--source"], args["--build"], args["--cuda"].upper() in ("ON", "1", "TRUE", "YES")
    errors = []

    kernel_files, all_functors = [], {}
    for rel, path in source_files(src):
        code = strip_comments(open(path, encoding="utf-8", errors="replace").read())
        is_kernel_file = rel.endswith("_kernels.cpp")
        uses_hd = "STP_HD" in code
        calls_launch = re.search(r"(?<![\w.>:])(?:stp::)?launch\s*\(", code) is not None
        if (uses_hd or calls_launch) and not is_kernel_file and rel not in EXCEPTIONS:
            errors.append(f"S1 {rel} defines a device functor or calls launch() but is not a *_kernels.cpp file, "
                          "so nvcc never compiles it: rename it or list it in EXCEPTIONS with the reason")
        if rel != "core/launch.h" and ("__global__" in code or "<<<" in code):
            errors.append(f"S2 {rel} holds hand-written device code (__global__ / <<<): write the math once as a functor")
        if rel.startswith("core/kernels/"):
            for m in DEVICE_KIND_TEST.finditer(code):
                line = code.count("\n", 0, m.start()) + 1
                errors.append(f"S5 {rel}:{line} tests the device kind ({m.group(0).strip()}): name a launch shape "
                              "(core/launch_shape.h) and let the launch layer choose the layout")
        if is_kernel_file:
            kernel_files.append(rel)
            for f in functors(code):
                all_functors.setdefault(f, []).append(rel)
    if "tools/bench/bench_runtime.cpp" in EXCEPTIONS and os.path.exists(os.path.join(src, "tools/bench/bench_runtime.cpp")):
        if "DeviceKind::Cuda" in open(os.path.join(src, "tools/bench/bench_runtime.cpp")).read():
            errors.append("S1 tools/bench/bench_runtime.cpp is listed as CPU-only but mentions DeviceKind::Cuda")
    for f, where in sorted(all_functors.items()):
        if len(where) > 1:
            errors.append(f"S3 functor {f} is defined in {len(where)} kernel files: {', '.join(where)}")
    if not kernel_files or not all_functors:
        errors.append("S1 found no *_kernels.cpp file with functors: the scan is broken")

    db_path = os.path.join(build, "compile_commands.json")
    if not os.path.exists(db_path):
        errors.append(f"S4 {db_path} is missing (CMAKE_EXPORT_COMPILE_COMMANDS is on in CMakeLists.txt; configure first)")
        db = {}
    else:
        db = {os.path.relpath(os.path.realpath(e["file"]), os.path.realpath(src)): e for e in json.load(open(db_path))}

    tools_ok = all(shutil.which(t) for t in ("nm", "readelf", "ar"))
    if not tools_ok:
        errors.append("O1 binutils (nm, readelf, ar) not found")
    checked = 0
    for rel in kernel_files:
        entry = db.get(rel)
        if entry is None:
            if db:
                errors.append(f"S4 {rel} is compiled by no target (not in compile_commands.json)")
            continue
        command = entry.get("command") or " ".join(entry.get("arguments", []))
        if cuda and (" -x cu" not in command or "nvcc" not in command):
            errors.append(f"C1 {rel} is not compiled by nvcc as CUDA in this CUDA build: {command[:160]}")
        out = re.search(r"(?:^|\s)-o\s+(\S+)", command)
        obj = os.path.join(entry.get("directory", build), entry.get("output") or (out.group(1) if out else ""))
        if not os.path.isfile(obj):
            errors.append(f"O1 object {obj} of {rel} does not exist: build before running this test")
            continue
        if not tools_ok:
            continue
        symbols = run(["nm", "-C", obj])
        names = [f for f, where in all_functors.items() if where == [rel]]
        for f in names:
            # A functor template (e.g. Convert<stp::bf16, float>) is checked per instantiation:
            # every one with a CPU path must have its device kernel too.
            targs = r"((?:<[^()\n]*>)?)"
            cpu = set(re.findall(r"launch(?:_blocks)?<[^\n]*::" + f + targs + r"\s*>\(stp::Stream&[^\n]*\{lambda\(unsigned long, unsigned long\)#1\}", symbols))
            if not cpu:
                errors.append(f"O1 {rel}: no CPU path of launch<{f}> in {obj} (functor defined but never launched?)")
            if cuda:
                dev = set(re.findall(r"__device_stub__[^\n]*stp_(?:generic|block)_kernel[^\n]*::" + f + targs + r"&\)", symbols))
                if not dev:
                    errors.append(f"C2 {rel}: no device kernel stp_generic_kernel<{f}> (or stp_block_kernel) in {obj}")
                for missing in sorted(cpu - dev) if dev else []:
                    errors.append(f"C2 {rel}: no device kernel stp_generic_kernel<{f}{missing}> (or stp_block_kernel) in {obj}")
            checked += 1
        if cuda and ".nv_fatbin" not in run(["readelf", "-S", "-W", obj]):
            errors.append(f"C2 {rel}: {obj} has no .nv_fatbin section (no device code)")
        if cuda and rel.startswith("core/"):
            lib = os.path.join(build, "libstp_core.a")
            if not os.path.exists(lib):
                errors.append(f"C3 {lib} does not exist: build stp_core before running this test")
                continue
            if os.path.basename(obj) not in run(["ar", "t", lib]).split():
                errors.append(f"C3 {os.path.basename(obj)} is not a member of {lib}, the library the CPU tests link")

    for e in errors:
        print("single-source: " + e)
    mode = "CUDA build: CPU path and device kernel checked per functor" if cuda else "CPU build: CPU path checked per functor"
    print(f"single-source: {len(kernel_files)} kernel file(s), {len(all_functors)} functor(s), {checked} checked in objects; "
          f"{mode}; exceptions: " + "; ".join(f"{k} ({v})" for k, v in EXCEPTIONS.items()))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
