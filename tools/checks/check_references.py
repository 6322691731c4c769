#!/usr/bin/env python3
"""Checks that the repository stands on its own: what the code and the docs cite is in the tree.

A clone has the code, docs/, README.md and CONTRIBUTING.md and nothing else: no design page or
research notes kept beside the repository, no issue tracker. So:

  * Code files (*.h *.hpp *.cpp *.cu *.cuh *.py *.sh *.cmake CMakeLists.txt, tools/gpu-check, tools/gpu-bench, tools/gpu-stream) and
    Markdown files (*.md) must not cite documents kept outside the tree: the old design page,
    the STP and pipeline-schedule notes (a reference/ folder; the tree's own tools/reference/ is
    a path like any other), the offload and style notes, a section sign (write
    "docs/schedules.md, STP op lists", not a section number of some other page).
  * Neither may cite issue numbers: "issue 8", "issue #8", "PR #12", a bare "#8", "Megatron-LM#7398".
    A public upstream bug is described in words ("the reordering bug Megatron-LM had").
  * Code must not carry the finding labels of docs/gpu-readiness.md ("(O7)", "O3:"): it says what
    the finding is, or cites "docs/gpu-readiness.md, <section title>". That page keeps its labels.
  * Every repository path named anywhere in those files (`folder/name.ext` or `folder/sub/` under a
    top-level folder of the tree, e.g. `core/device.h`, `docs/model.md`, `core/cpu/`) and every
    relative Markdown link must exist.

Usage: tools/checks/check_references.py [ROOT]     (default: the repository holding this script)
Prints one line per violation (FILE:LINE: what) and exits 1 if there is any, else prints a summary
and exits 0. This file itself is not scanned: its patterns name what they forbid.
"""
import os
import re
import sys

CODE_EXTS = (".h", ".hpp", ".cpp", ".cu", ".cuh", ".py", ".sh", ".cmake")
CODE_NAMES = ("CMakeLists.txt", "gpu-check", "gpu-bench", "gpu-stream")
SKIP_DIRS = {".git", "__pycache__", "runs"}
SELF = "tools/checks/check_references.py"

# (what, pattern): forbidden in code and Markdown alike.
CITATIONS = [
    ("cites the design page kept outside the tree", re.compile(r"\bDESIGN(?:\.md)?\b")),
    ("cites a reference note kept outside the tree",
     re.compile(r"shared/|(?<!tools/)reference/|stp-spec|pp-schedules|offload-anchors|stp-paper-readme|\bSTP spec\b")),
    ("cites the style notes kept outside the tree", re.compile(r"aesthetics|\blessons? L\d+")),
    ("cites a section number of a page (name the file and the section title)", re.compile(r"§")),
    ("cites an issue number", re.compile(r"\b(?:issues?|Issues?|PRs?|pull request)\s+#?\d+\b")),
    ("cites an issue number", re.compile(r"(?:^|(?<=[\s(\[,/;]))#\d+\b")),
    ("cites an issue of another tracker by number (describe it in words)", re.compile(r"(?<=[A-Za-z0-9_])#\d+\b")),
]
# Finding labels of docs/gpu-readiness.md (O1..O13, F1..F6): forbidden in code only. A bare F<digit>
# is an op string far more often than a finding, so F labels are caught only after "finding(s)".
LABEL = re.compile(r"(?<![-\w/.])O\d{1,2}(?![\w.])|\bfindings? [OF]\d{1,2}\b|gpu-readiness\.md, [OF]\d")
# Files that may use such labels for something else, with the reason.
LABEL_EXEMPT = {
    # Its rule names S1-S4, O1, C1-C3 are the rules of the single-source check (listed in
    # docs/gpu-readiness.md, 7. Kernels: single source), printed in its reports.
    "tests/tools/single_source_check.py",
}

PATH_EXTS = r"(?:h|hpp|cpp|cu|cuh|py|sh|md|yaml|yml|txt|cmake|svg|json|csv|bin|safetensors)"
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def top_folders(root):
    return sorted(d for d in os.listdir(root)
                  if os.path.isdir(os.path.join(root, d)) and not d.startswith(".")
                  and not d.startswith("build") and d not in SKIP_DIRS)


def path_pattern(folders):
    alt = "|".join(re.escape(f) for f in folders)
    # A path starts at a top-level folder (not inside a longer word or another path such as
    # build/tests/...), has no wildcard or brace, and ends in a known extension.
    return re.compile(r"(?<![\w.\-/$*{])((?:" + alt + r")/[\w./\-]*?\w\." + PATH_EXTS + r")(?![\w*{}/\-])"
                      r"|(?<![\w.\-/$*{])((?:" + alt + r")/(?:[\w\-]+/)*)(?![\w*{}\-])")


def is_code(rel):
    name = os.path.basename(rel)
    return name in CODE_NAMES or name.endswith(CODE_EXTS)


def files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIP_DIRS and not d.startswith(".") and not
                             (dirpath == root and d.startswith("build")))
        for f in sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
            if rel == SELF:
                continue
            if is_code(rel) or f.endswith(".md"):
                yield rel


# A placeholder (tools/stp/cmd_NAME.cpp, checkpoint-STEP/...) is not a path.
PLACEHOLDER = re.compile(r"(?<![A-Za-z])(?:NAME|STEP|FILE|X|N)(?![a-z])")


def made_here(text, path):
    """True for a placeholder, or for a file of a synthetic tree that this file builds itself
    (a shell test writing "$tmp/src/models/bad.cpp" may name models/bad.cpp)."""
    return bool(PLACEHOLDER.search(path) or
                re.search(r"\$\{?\w+\}?(?:/[\w.\-]+)*/" + re.escape(path), text))


def check(root):
    paths = path_pattern(top_folders(root))
    errors, scanned = [], 0
    for rel in files(root):
        scanned += 1
        code = is_code(rel)
        try:
            text = open(os.path.join(root, rel), encoding="utf-8").read()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for what, pattern in CITATIONS:
                m = pattern.search(line)
                if m:  # one report per line is enough
                    errors.append(f"{rel}:{n}: {what}: '{m.group(0)}' in: {line.strip()[:160]}")
                    break
            if code and rel not in LABEL_EXEMPT:
                m = LABEL.search(line)
                if m:
                    errors.append(f"{rel}:{n}: carries a finding label of docs/gpu-readiness.md "
                                  f"(say what it is in words): '{m.group(0)}' in: {line.strip()[:160]}")
            for m in paths.finditer(line):
                path = m.group(1) or m.group(2)
                if not os.path.exists(os.path.join(root, path)) and not made_here(text, path):
                    errors.append(f"{rel}:{n}: names a path that does not exist: {path}")
            if rel.endswith(".md"):
                for m in LINK.finditer(line):
                    target = m.group(1)
                    if re.match(r"[a-z]+:", target) or target.startswith("/"):
                        continue
                    if not os.path.exists(os.path.join(root, os.path.dirname(rel), target)):
                        errors.append(f"{rel}:{n}: links to a file that does not exist: {target}")
    return errors, scanned


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    errors, scanned = check(root)
    for e in errors:
        print(e)
    if errors:
        print(f"check_references: {len(errors)} problem(s) in {scanned} files")
        return 1
    print(f"check_references: {scanned} files cite only what the repository holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
