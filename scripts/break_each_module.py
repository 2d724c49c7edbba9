#!/usr/bin/env python3
"""Do the tests notice when a module is broken? For each module of deployer/ and
benchmarks/, break its longest function in a scratch copy of the tree (its first
statement becomes `raise RuntimeError`), run the tests there until the first failure,
and print which test caught it. A module whose break no test notices is a gap.

deployer/ modules are held to the fast tier (no root, no real part). The benchmarks are
scripts that run under mpirun with torch, which the fast tier never starts by design, so
they are held to the benchmark tests of the slow tier (tests/unit/test_bench_*.py).

    .venv/bin/python scripts/break_each_module.py [--only deployer/spec.py ...] [--json out.json]

Nothing in the checkout changes: every break happens in a temporary copy.
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
COPY = ["deployer", "benchmarks", "tests", "terraform", "ansible", "monitoring", "pyproject.toml", ".github"]
FAST = ["-m", "not integration and not slow", "tests"]
BENCH = ["-m", "not integration", *sorted(f"tests/unit/{p.name}" for p in (REPO / "tests" / "unit").glob("test_bench_*.py"))]


def modules() -> list[Path]:
    found = sorted(p for d in ("deployer", "benchmarks") for p in (REPO / d).rglob("*.py")
                   if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts)
    return [p.relative_to(REPO) for p in found]


def longest_function(source: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function or method with the most lines whose body is more than a docstring."""
    best: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body[1:] if (node.body and isinstance(node.body[0], ast.Expr)
                                     and isinstance(node.body[0].value, ast.Constant)
                                     and isinstance(node.body[0].value.value, str)) else node.body
            if not body:
                continue
            if best is None or node.end_lineno - node.lineno > best.end_lineno - best.lineno:  # type: ignore[operator]  # ast.parse sets end_lineno
                best = node
    return best


def broken(source: str, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    lines = source.split("\n")
    first = (
        fn.body[1]
        if (len(fn.body) > 1 and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant))
        else fn.body[0]
    )
    at = first.lineno - 1
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    lines.insert(at, f'{indent}raise RuntimeError("deliberately broken by scripts/break_each_module.py")')
    return "\n".join(lines)


def run_tests(tree: Path, selection: list[str], timeout: int) -> tuple[bool, str]:
    p = subprocess.run([sys.executable, "-m", "pytest", *selection, "-x", "-q", "-p", "no:cacheprovider"],
                       cwd=tree, env={**__import__("os").environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, timeout=timeout)
    failed = [ln.split(" ", 1)[1].split(" - ")[0] for ln in p.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    return p.returncode != 0, (failed[0] if failed else p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="module paths to try (default: every module)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="break-") as tmp:
        tree = Path(tmp) / "tree"
        for part in COPY:
            src = REPO / part
            if src.is_dir():
                shutil.copytree(src, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
            elif src.exists():
                shutil.copy2(src, tree / part)
        for rel in [Path(m) for m in args.only] if args.only else modules():
            original = (tree / rel).read_text()
            fn = longest_function(original)
            if fn is None:
                results.append({"module": str(rel), "function": None, "caught": None, "by": "no function to break"})
                continue
            (tree / rel).write_text(broken(original, fn))
            t0 = time.monotonic()
            try:
                tier = "slow" if rel.parts[0] == "benchmarks" else "fast"
                caught, by = run_tests(tree, BENCH if tier == "slow" else FAST, args.timeout)
            finally:
                (tree / rel).write_text(original)
            row = {"module": str(rel), "function": fn.name, "tier": tier, "caught": caught, "by": by,
                   "seconds": round(time.monotonic() - t0, 1)}
            results.append(row)
            print(f"{'caught ' if caught else 'MISSED '} [{tier}] {rel}:{fn.name}  ({row['seconds']}s)  {by}", flush=True)
    missed = [r for r in results if r["caught"] is False]
    print(f"\n{sum(1 for r in results if r['caught'])} of {sum(1 for r in results if r['caught'] is not None)} broken modules caught"
          + (f"; missed: {', '.join(r['module'] for r in missed)}" if missed else ""))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
