#!/usr/bin/env python3
"""Tree rules: which folders may name what. Each rule lists the files it scans, a pattern their
code must not contain (line comments are not scanned: a comment may point at any file), and the
files exempt from it. Prints one line per violation, "RULE FILE:LINE: TEXT", and
exits 1 when there is any.

Usage: check_tree.py [SOURCE_DIR]   (default: the repository this script lives in)
"""
import pathlib
import re
import sys

# (name, globs scanned, forbidden regex, exempt paths, why)
RULES = [
    ("optimizer-seam", ["train/*.cpp", "train/*.h", "tools/**/*.cpp", "tools/**/*.h"],
     r"\b(ReplicatedOptimizer|OffloadedOptimizer|DistributedOptimizer|HostUpdate|DpGradSync|GradClipper)\b"
     r"|optim/(replicated_optimizer|offloaded_optimizer|distributed_optimizer|host_update|dp_grad_sync)\.h",
     [],
     "train/ and the tools drive a rank's optimizer through RankOptimizer (optim/rank_optimizer.h) only"),
    ("optimizer-factory", ["optim/*.cpp", "optim/*.h"],
     r"make_unique<(ReplicatedOptimizer|OffloadedOptimizer|DistributedOptimizer)>",
     ["optim/rank_optimizer.cpp"],
     "make_rank_optimizer is the only place that chooses an optimizer mechanism"),
]


def code_of(line: str) -> str:
    """The line without its // comment (a // inside a string literal ends nothing)."""
    out, in_string = [], False
    i = 0
    while i < len(line):
        c = line[i]
        if in_string:
            if c == "\\":
                out.append(line[i:i + 2])
                i += 2
                continue
            in_string = c != '"'
        elif c == '"':
            in_string = True
        elif line.startswith("//", i):
            break
        out.append(c)
        i += 1
    return "".join(out)


def check(root: pathlib.Path):
    problems = []
    for name, globs, pattern, exempt, why in RULES:
        rx = re.compile(pattern)
        seen = set()
        for g in globs:
            for f in sorted(root.glob(g)):
                rel = f.relative_to(root).as_posix()
                if rel in seen or rel in exempt or not f.is_file():
                    continue
                seen.add(rel)
                for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                    if rx.search(code_of(line)):
                        problems.append(f"{name} {rel}:{n}: {line.strip()}  ({why})")
    return problems


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_tree: {len(problems)} violation(s)")
        return 1
    print(f"check_tree: {len(RULES)} rules hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
