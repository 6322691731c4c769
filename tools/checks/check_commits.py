#!/usr/bin/env python3
"""Checks commit hygiene: every commit made after the last grandfathered commit has a subject line
of at most 72 characters (CONTRIBUTING.md, Before you commit); the numbers and detail go in the
body.

The subject is what `git log --format=%s` shows: the first paragraph of the message, its lines
joined, so a message without a blank line after its first line is measured whole. Characters are
counted, not bytes. Merge commits are checked too.

Commits up to and including BASE (the last commit before the rule, GRANDFATHERED below) are not
checked. The check needs the history from BASE to HEAD; where it cannot see it, it says why and
exits 77 (skipped), never 0:

  * ROOT is not the top of a git work tree (a tarball, an export, a tree copied without .git);
  * BASE is not in the repository (a shallow clone that stops after it): fetch with more depth
    (`git fetch --unshallow`) to check;
  * BASE is not an ancestor of HEAD (a history that does not contain the rule's start).

Usage: tools/checks/check_commits.py [ROOT] [--base REV] [--head REV] [--max N]
  ROOT defaults to the repository holding this script, BASE to GRANDFATHERED, HEAD to HEAD, N to 72.
Prints one line per long subject (commit, length, subject) and exits 1 if there is any; else a
summary and 0.
"""
import argparse
import os
import subprocess
import sys

# The last commit whose subject is not checked: main's HEAD when the rule was introduced.
GRANDFATHERED = "cb1d695ad8c6cc2c5c5b336706ae42b32546fff7"
MAX_SUBJECT = 72
SKIPPED = 77


def git(root, *args):
    """Runs git in ROOT; returns (status, stdout as text)."""
    try:
        p = subprocess.run(["git", "-C", root, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except FileNotFoundError:
        return 127, ""
    return p.returncode, p.stdout.decode("utf-8", errors="replace")


def skip(why):
    print(f"check_commits: skipped: {why}")
    return SKIPPED


def check(root, base, head, limit):
    status, top = git(root, "rev-parse", "--show-toplevel")
    if status == 127:
        return skip("git is not installed")
    # A tree without .git inside some other repository must not be judged by that repository's log.
    if status != 0 or os.path.realpath(top.strip()) != os.path.realpath(root):
        return skip(f"{root} is not the top of a git work tree (a tarball or an export has no history)")
    if git(root, "cat-file", "-e", f"{base}^{{commit}}")[0] != 0:
        shallow = git(root, "rev-parse", "--is-shallow-repository")[1].strip() == "true"
        why = "a shallow clone: `git fetch --unshallow` brings it" if shallow else "the history lacks it"
        return skip(f"base commit {base[:12]} is not in this repository ({why})")
    if git(root, "rev-parse", "--verify", "--quiet", f"{head}^{{commit}}")[0] != 0:
        print(f"check_commits: error: '{head}' is not a commit in {root}")
        return 2
    if git(root, "merge-base", "--is-ancestor", base, head)[0] != 0:
        return skip(f"base commit {base[:12]} is not an ancestor of {head}")
    # NUL-separated records: a subject may hold any character but NUL.
    status, out = git(root, "log", "--format=%H%x00%s%x00", f"{base}..{head}")
    if status != 0:
        print(f"check_commits: error: git log {base[:12]}..{head} failed in {root}")
        return 2
    fields = out.split("\0")
    commits = [(fields[i].strip(), fields[i + 1]) for i in range(0, len(fields) - 1, 2)]
    long = [(h, s) for h, s in commits if len(s) > limit]
    for h, s in long:
        print(f"{h[:12]}: subject of {len(s)} characters (at most {limit}; put the numbers and detail "
              f"in the body): {s}")
    if long:
        print(f"check_commits: {len(long)} of {len(commits)} commit(s) after {base[:12]} have a subject "
              f"longer than {limit} characters")
        return 1
    print(f"check_commits: {len(commits)} commit(s) after {base[:12]}, every subject at most {limit} characters")
    return 0


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="Commit subjects after the grandfathered base are at most 72 characters.")
    ap.add_argument("root", nargs="?", default=os.path.dirname(os.path.dirname(here)))
    ap.add_argument("--base", default=GRANDFATHERED, help="the last commit not checked (default: %(default)s)")
    ap.add_argument("--head", default="HEAD", help="the newest commit checked (default: %(default)s)")
    ap.add_argument("--max", type=int, default=MAX_SUBJECT, help="longest subject allowed (default: %(default)s)")
    a = ap.parse_args()
    return check(os.path.abspath(a.root), a.base, a.head, a.max)


if __name__ == "__main__":
    sys.exit(main())
