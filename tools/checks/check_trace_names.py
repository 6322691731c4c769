#!/usr/bin/env python3
"""Checks that the trace's stream and counter-track names are defined once: in base/trace_names.h.

The writers of a trace (streams, the arena and pinned pool counters, the executor, the optimizers)
and its readers (profile/, the schedule's deadlock check and trace renderer) must agree on every
stream and track name, so each is a constant of base/trace_names.h (namespaces trace::stream and
trace::track) and no other source file spells one. The names are read from the header's
`namespace stream { ... }` and `namespace track { ... }` blocks, so a name added there is checked
from then on. A C++ source file (*.h *.hpp *.cpp *.cu *.cuh) outside tests/ that holds a string
literal equal to such a name ("compute") or that name followed by one space ("p2p ", the start of
a name built by concatenation) is reported, comments included. Tests may spell the names where
they assert the exported format.

Usage: tools/checks/check_trace_names.py [ROOT]     (default: the repository holding this script)
Prints one line per violation (FILE:LINE: what) and exits 1 if there is any, or if the header
yields no stream or track names (the check would be looking for nothing); else prints a summary
and exits 0.
"""
import os
import re
import sys

HEADER = "base/trace_names.h"
BLOCKS = ("stream", "track")
CODE_EXTS = (".h", ".hpp", ".cpp", ".cu", ".cuh")
SKIP_DIRS = {".git", "__pycache__", "runs"}
CONSTANT = re.compile(r'\b(k\w+)\[\]\s*=\s*"([^"\\]+)"')


def names(root):
    """{literal: "trace::<block>::<constant>"} from the header's stream and track blocks."""
    found = {}
    counts = {}
    block = None
    with open(os.path.join(root, HEADER), encoding="utf-8") as f:
        for line in f:
            opened = re.match(r"\s*namespace (\w+) \{", line)
            if opened and opened.group(1) in BLOCKS:
                block = opened.group(1)
                counts.setdefault(block, 0)
                continue
            if block and re.match(r"\s*\}", line):
                block = None
                continue
            if block:
                for constant, literal in CONSTANT.findall(line):
                    found[literal] = "trace::%s::%s" % (block, constant)
                    counts[block] += 1
    return found, counts


def files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIP_DIRS and not d.startswith(".") and
                             not (rel_dir == "." and (d.startswith("build") or d == "tests")))
        for name in sorted(filenames):
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if name.endswith(CODE_EXTS) and rel != HEADER:
                yield rel


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    try:
        vocabulary, counts = names(root)
    except OSError as e:
        print("trace names: cannot read %s: %s" % (HEADER, e))
        return 1
    missing = [b for b in BLOCKS if not counts.get(b)]
    if missing:
        print("trace names: %s has no %s names (namespace %s { ... } with kName[] = \"...\" constants); "
              "the check would find nothing" % (HEADER, " or ".join(missing), " / ".join(missing)))
        return 1
    patterns = [(re.compile(re.escape('"' + n + '"') + "|" + re.escape('"' + n + ' "')), n, c)
                for n, c in sorted(vocabulary.items())]
    bad = []
    scanned = 0
    for rel in files(root):
        scanned += 1
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                for pattern, name, constant in patterns:
                    if pattern.search(line):
                        bad.append('%s:%d: spells the trace name "%s"; use %s (%s)' %
                                   (rel, number, name, constant, HEADER))
    for b in bad:
        print(b)
    if bad:
        return 1
    print("trace names: %d stream and %d track names of %s, spelled in none of %d other source files" %
          (counts["stream"], counts["track"], HEADER, scanned))
    return 0


if __name__ == "__main__":
    sys.exit(main())
