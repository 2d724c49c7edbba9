"""The deployer's import graph at the scale of rooms, from the code's own imports: a package
of deployer/ (check/, bench/, launch/, pipeline/, providers/, tools/) is one room, every other
module of deployer/ is one room, and scripts/ is one room. Prints the rooms from the top floor
down (a room stands above everything it imports), the arrows per room, and every circle.

    python scripts/import_floors.py            # the floors and the figures
    python scripts/import_floors.py --arrows   # every arrow, one per line
    python scripts/import_floors.py --json

Exit 1 when two rooms import each other, directly or round a circle: the floors are then no
longer a ladder (docs/architecture.md, "Where the code is"). tests/unit/test_import_floors.py
holds the code to that. Imports under `if TYPE_CHECKING:` count: they are arrows a reader
follows too.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def room_of(path: Path) -> str:
    """deployer/check/run.py -> deployer/check/; deployer/state.py -> deployer/state.py."""
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "scripts":
        return "scripts/"
    if len(rel.parts) > 2:
        return f"{rel.parts[0]}/{rel.parts[1]}/"
    return rel.as_posix()


def _module_file(module: str) -> Path | None:
    base = ROOT / module.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported(path: Path) -> set[str]:
    """The deployer modules (dotted) that one file imports."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from . import ui` names a module
    return {m for m in found if m == "deployer" or m.startswith("deployer.")}


def graph() -> dict[str, set[str]]:
    files = [p for p in (ROOT / "deployer").rglob("*.py")] + sorted((ROOT / "scripts").glob("*.py"))
    arrows: dict[str, set[str]] = defaultdict(set)
    for f in files:
        src = room_of(f)
        arrows.setdefault(src, set())
        for module in _imported(f):
            target = _module_file(module)
            # deployer/__init__.py only names the package: importing a submodule passes through it.
            if target is None or target == ROOT / "deployer" / "__init__.py":
                continue
            dst = room_of(target)
            if dst != src:
                arrows[src].add(dst)
    # `python -m deployer` (the CLI's doorway) and the package's face: no rooms of their own
    for face in ("deployer/__main__.py", "deployer/__init__.py"):
        arrows.pop(face, None)
    return dict(arrows)


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one room (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(arrows.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(arrows):
        if v not in index:
            visit(v)
    return found


def floors(arrows: dict[str, set[str]]) -> dict[str, int]:
    """Floor 1: imports no room; otherwise one above the highest room it imports."""
    floor: dict[str, int] = {}

    def of(v: str, seen: frozenset[str] = frozenset()) -> int:
        if v not in floor:
            below = [of(w, seen | {v}) for w in arrows.get(v, ()) if w not in seen | {v}]
            floor[v] = 1 + max(below, default=0)
        return floor[v]

    for v in arrows:
        of(v)
    return floor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arrows", action="store_true", help="every arrow, one per line")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    arrows = graph()
    loops = circles(arrows)
    n_arrows = sum(len(v) for v in arrows.values())
    if a.json:
        print(json.dumps({"rooms": len(arrows), "arrows": n_arrows, "circles": loops,
                          "imports": {k: sorted(v) for k, v in sorted(arrows.items())}}, indent=2))
    elif a.arrows:
        for src in sorted(arrows):
            for dst in sorted(arrows[src]):
                print(f"{src} -> {dst}")
    else:
        by_floor: dict[int, list[str]] = defaultdict(list)
        for room, f in floors(arrows).items():
            by_floor[f].append(room)
        for f in sorted(by_floor, reverse=True):
            print(f"floor {f:2}  " + ", ".join(sorted(by_floor[f])))
        print(f"{len(arrows)} rooms, {n_arrows} arrows ({n_arrows / len(arrows):.2f} a room), {len(loops)} circle(s)")
    for loop in loops:
        print("circle: " + " <-> ".join(loop), file=sys.stderr)
    return 1 if loops else 0


if __name__ == "__main__":
    sys.exit(main())
