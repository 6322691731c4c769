#!/usr/bin/env python3
"""Checks that the build graph tells the truth: every quoted #include climbs no layer, and every
layer edge the build declares is used.

The layers are the stp_library(NAME DIRS ... DEPENDS ...) calls of the top-level CMakeLists.txt.
A source file belongs to the library whose DIRS entry is the longest prefix of its folder
(core/cuda/ is in stp_core because core/ is). Rules:

  * A library's file may include headers of its own library and of the libraries it DEPENDS on,
    directly or through others; never tests/ or tools/.
  * tests/X/ tests the library stp_X: it may include what stp_X may include, stp_X's own headers,
    and tests/ helpers. tests/profile and tests/tools also link stp_train (tests/CMakeLists.txt).
  * tests/support/ holds header-only helpers; a suite that includes one links what it needs.
  * tools/ (tools/stp/, tools/cli/, tools/bench/) links every library: any library header, never
    tests/. Only tools/ and tests/tools/ (which links tools_cli, the executables' shared helpers in
    tools/cli/) include tools/ headers.
  * Every stp_* library a library DEPENDS on directly is included by at least one of its files.

Usage: tools/checks/check_layers.py [ROOT]     (default: the repository holding this script)
Prints one line per violation and exits 1 if there is any, else prints a summary and exits 0.
"""
import os
import re
import sys

SOURCE_EXTS = (".h", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# Extra libraries a test folder links besides stp_<folder> (mirrors tests/CMakeLists.txt).
TEST_EXTRA = {"profile": ["stp_train"], "tools": ["stp_profile", "stp_train"]}


def read_layers(root):
    text = open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8").read()
    text = re.sub(r"#[^\n]*", "", text)
    layers = {}
    for m in re.finditer(r"^\s*stp_library\(([^)]*)\)", text, re.M):
        words = m.group(1).split()
        name, dirs, deps, key = words[0], [], [], None
        for w in words[1:]:
            if w in ("DIRS", "DEPENDS"):
                key = w
            elif key == "DIRS":
                dirs.append(w)
            elif key == "DEPENDS" and w.startswith("stp_"):
                deps.append(w)
        layers[name] = {"dirs": dirs, "deps": deps}
    return layers


def closure(layers, name):
    seen, todo = set(), list(layers[name]["deps"])
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(layers.get(d, {"deps": []})["deps"])
    return seen


def owner(layers, folder):
    best, best_len = None, -1
    for name, layer in layers.items():
        for d in layer["dirs"]:
            if (folder == d or folder.startswith(d + "/")) and len(d) > best_len:
                best, best_len = name, len(d)
    return best


def source_files(root):
    for top in sorted(os.listdir(root)):
        if top.startswith(".") or top.startswith("build") or not os.path.isdir(os.path.join(root, top)):
            continue
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in sorted(filenames):
                if f.endswith(SOURCE_EXTS):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def check(root):
    layers = read_layers(root)
    if not layers:
        return ["CMakeLists.txt: no stp_library(NAME DIRS ... DEPENDS ...) calls found"], 0
    for name, layer in layers.items():
        for d in layer["deps"]:
            if d not in layers:
                return [f"CMakeLists.txt: {name} DEPENDS on {d}, which is not an stp_library"], 0
    problems, used_edges, count = [], set(), 0
    for path in source_files(root):
        folder = os.path.dirname(path)
        top = path.split("/")[0]
        src = open(os.path.join(root, path), encoding="utf-8", errors="replace").read()
        if path.startswith("tests/support/"):
            allowed, who = set(layers), "tests/support"  # header-only helpers: a suite that includes one links what it needs
        elif top == "tests":
            suite = path.split("/")[1] if path.count("/") >= 2 else ""
            libs = [f"stp_{suite}"] + TEST_EXTRA.get(suite, [])
            libs = [l for l in libs if l in layers]
            allowed = set(libs).union(*[closure(layers, l) for l in libs]) if libs else set()
            who = f"tests/{suite}" + (f" (links {', '.join(libs)})" if libs else " (links no stp library)")
        elif top == "tools":
            allowed, who = set(layers), "tools"
        else:
            me = owner(layers, folder)
            if me is None:
                continue  # not a library folder (cmake/, docs/, ...)
            allowed, who = {me} | closure(layers, me), me
        for m in INCLUDE.finditer(src):
            inc = m.group(1)
            line = src.count("\n", 0, m.start()) + 1
            inc_top = inc.split("/")[0]
            if "/" not in inc:
                continue  # a sibling header of a third-party or generated kind
            count += 1
            if inc_top == "tests":
                if top != "tests":
                    problems.append(f"{path}:{line}: includes {inc}: only tests/ may include test helpers")
                continue
            if inc_top == "tools":
                if top != "tools" and not path.startswith("tests/tools/"):
                    problems.append(f"{path}:{line}: includes {inc}: tools/ is the top layer, nothing includes it")
                continue
            target = owner(layers, os.path.dirname(inc))
            if target is None:
                if os.path.exists(os.path.join(root, inc)):
                    problems.append(f"{path}:{line}: includes {inc}, which belongs to no stp_library")
                continue
            if target not in allowed:
                problems.append(f"{path}:{line}: includes {inc} ({target}), but {who} does not depend on "
                                f"{target}: an include that climbs a layer (CMakeLists.txt, stp_library)")
            elif top not in ("tests", "tools") and target != who:
                used_edges.add((who, target))
    for name, layer in layers.items():
        for d in layer["deps"]:
            if (name, d) not in used_edges:
                problems.append(f"CMakeLists.txt: {name} DEPENDS on {d}, but no file of {name} includes a "
                                f"header of {d}: remove the edge or use it")
    return problems, count


def main():
    here = os.path.dirname(os.path.abspath(__file__))  # tools/checks/
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(here))
    problems, count = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} problem(s)")
        return 1
    print(f"check_layers: {count} includes in {len(read_layers(root))} layers, none climbs; every declared edge is used")
    return 0


if __name__ == "__main__":
    sys.exit(main())
