"""Measure the shape of the code: module and class sizes, function lengths.

    python scripts/code_shape.py [--limit-module 500] [--limit-class 250]

Prints modules over the module limit, classes over the class limit, and the
median and 90th percentile of function lengths (lines from ``def`` to the last
line of the body, decorators and docstrings included) for ``cdc/`` and
``publishers/``. Exits 1 when a limit is broken, so it can guard a refactoring.
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
from pathlib import Path

PACKAGES = ("cdc", "publishers")


def _lengths(tree: ast.AST) -> tuple[list[int], list[tuple[str, int]]]:
    functions: list[int] = []
    classes: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions.append(node.end_lineno - node.lineno + 1)  # type: ignore[operator]
        elif isinstance(node, ast.ClassDef):
            classes.append((node.name, node.end_lineno - node.lineno + 1))  # type: ignore[operator]
    return functions, classes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-module", type=int, default=500)
    parser.add_argument("--limit-class", type=int, default=250)
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    functions: list[int] = []
    broken = 0
    for path in sorted(p for package in PACKAGES for p in (root / package).rglob("*.py")):
        text = path.read_text()
        lines = text.count("\n")
        name = path.relative_to(root)
        if lines > args.limit_module:
            print(f"module {name}: {lines} lines")
            broken += 1
        found, classes = _lengths(ast.parse(text))
        functions += found
        for cls, length in classes:
            if length > args.limit_class:
                print(f"class {name}::{cls}: {length} lines")
                broken += 1
    p90 = statistics.quantiles(functions, n=10)[-1]
    print(f"functions: {len(functions)}, median {statistics.median(functions):g}, p90 {p90:g} lines")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
