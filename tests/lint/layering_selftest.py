#!/usr/bin/env python3
"""The self-test of tests/lint/layering.py, on the small fake trees in tests/lint/planted/.

    python3 tests/lint/layering_selftest.py

planted/<rule>/ breaks one rule; planted/clean/ breaks none, with the cases a careless reader
of C++ would trip on. Each line the lint must report carries the comment `planted: <rule>`;
the lint must report exactly those lines, under that rule, and fail (the clean tree: pass).
A tree is read as include/ (the folder that holds kshard/) and, where present, tools/.
"""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LINT = os.path.join(HERE, "layering.py")
PLANTED = os.path.join(HERE, "planted")
MARKER = re.compile(r"planted: ([\w-]+)")
REPORTED = re.compile(r"(?P<path>[^\s:][^:]*):(?P<line>\d+): (?P<rule>[\w-]+): ")


def marked_lines(tree):
    """{(path relative to the tree, line, rule)} of the `planted:` markers in a tree."""
    marked = set()
    for folder, dirs, files in os.walk(tree):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    marked |= {(os.path.relpath(path, tree), n, m) for m in MARKER.findall(line)}
    return marked


def run_lint(tree):
    command = [sys.executable, LINT, "--include", os.path.join(tree, "include")]
    if os.path.isdir(os.path.join(tree, "tools")):
        command += ["--tools", os.path.join(tree, "tools")]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def reported_lines(tree, stdout):
    reported = set()
    for line in stdout.splitlines():
        m = REPORTED.match(line)
        if m:
            path = os.path.relpath(m.group("path"), tree)
            reported.add((path, int(m.group("line")), m.group("rule")))
    return reported


def check_tree(name):
    """Problems with the lint's answer on planted/<name>, as lines of text (none: it is right)."""
    tree = os.path.join(PLANTED, name)
    expected, result = marked_lines(tree), run_lint(tree)
    reported = reported_lines(tree, result.stdout)
    problems = []
    if name != "clean" and ({rule for _, _, rule in expected} != {name}):
        problems.append(f"its `planted:` markers should all name {name}: {sorted(expected)}")
    if result.returncode != (1 if expected else 0):
        problems.append(f"exit status {result.returncode}, expected {1 if expected else 0}")
    problems += [f"not reported: {p}:{n}: {r}" for p, n, r in sorted(expected - reported)]
    problems += [f"reported, not planted: {p}:{n}: {r}" for p, n, r in sorted(reported - expected)]
    if result.stderr or not result.stdout.splitlines()[-1:][0].startswith("layering: "):
        problems.append("no summary line, or output on stderr")
    if problems:
        problems.append("the lint said:\n" + result.stdout + result.stderr)
    return problems


def main():
    trees = sorted(os.listdir(PLANTED))
    if "clean" not in trees or len(trees) < 2:
        print(f"layering_selftest: {PLANTED} should hold clean/ and one tree per rule")
        return 1
    failed = 0
    for name in trees:
        problems = check_tree(name)
        failed += bool(problems)
        print(f"{'FAIL' if problems else 'ok  '} {name}")
        for problem in problems:
            print("     " + problem.replace("\n", "\n     "))
    print(f"layering_selftest: {len(trees) - failed} of {len(trees)} planted trees as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
