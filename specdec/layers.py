"""The package's layers, bottom to top, and the two import rules they make.

1. A module imports from its own layer or a lower one, never from a higher one. The root package `specdec` (its
   __init__, the public API) sits at the top: a module inside the package imports the module that defines a name
   (`from specdec.measure import mean`), never through the root (`from specdec import measure`).
2. No import circle, between modules or between packages. Imports inside functions count: a lazy import hides a
   circle from Python's import machinery, not from the reader.

The rules read the source (ast), never import it, so a broken module is still checked. `python -m specdec.layers`
prints every breach (exit status 1 when there is one); `--mermaid` prints the diagram of docs/architecture.md and
`--write docs/architecture.md` puts it there, between the markers.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = "specdec"
# Bottom to top. A unit is a subpackage or a top-level module of specdec; "specdec" is the root package itself.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("utilities", ("errors", "atomic", "inputs", "measure", "provenance", "paths", "client", "outputs", "layers")),
    ("math", ("sampling", "theory")),
    ("kernels", ("kernels",)),
    ("models", ("models",)),
    ("heads", ("heads",)),
    ("drafters", ("drafters",)),
    ("runtime", ("runtime",)),
    ("engine", ("engine",)),
    ("applications", ("train", "bench", "audit", "serve", "explain", "integrations")),
    ("entry points", (ROOT, "api", "cli")),
)
LEVEL = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}
BEGIN, END = "<!-- layers:begin (python -m specdec.layers --write docs/architecture.md) -->", "<!-- layers:end -->"


@dataclass(frozen=True)
class Import:
    src: str  # the importing module, e.g. specdec.engine.stats
    dst: str  # the imported module (a submodule when `from package import submodule`)
    line: int


def module_names(root: Path) -> dict[str, Path]:
    """Every module under the package folder `root`, by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(root: Path) -> list[Import]:
    """Every import of one module of the package by another, wherever it stands in the file."""
    mods = module_names(root)
    found: list[Import] = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                # `from package import submodule` imports the submodule, except through the root (rule 1)
                targets = [f"{base}.{a.name}" if base != ROOT and f"{base}.{a.name}" in mods else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                if target == ROOT or target.startswith(ROOT + "."):
                    found.append(Import(name, _existing(target, mods), node.lineno))
    return sorted(set(found), key=lambda i: (i.src, i.line, i.dst))


def _existing(target: str, mods: dict[str, Path]) -> str:
    while target not in mods and "." in target:  # `import specdec.x.name`: the module that holds it
        target = target.rpartition(".")[0]
    return target


def unit(module: str) -> str:
    """The layer table's name for a module's subpackage (or top-level module)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def problems(root: Path) -> list[str]:
    """One line per breach of the rules, for the package folder `root`."""
    found = imports(root)
    out = [f"{u}: not in the layer table (specdec/layers.py LAYERS)"
           for u in sorted({unit(m) for m in module_names(root)} - set(LEVEL))]
    for i in found:
        a, b = unit(i.src), unit(i.dst)
        if a in LEVEL and b in LEVEL and LEVEL[b] > LEVEL[a]:
            how = " (through the root package: import the defining module)" if i.dst == ROOT else ""
            out.append(f"upward: {i.src} (line {i.line}, {LAYERS[LEVEL[a]][0]}) imports {i.dst} "
                       f"({LAYERS[LEVEL[b]][0]}){how}")
    module_edges = {(i.src, i.dst) for i in found if i.src != i.dst}
    out += [f"module circle: {' -> '.join(c)}" for c in circles(module_edges)]
    unit_edges = {(unit(a), unit(b)) for a, b in module_edges if unit(a) != unit(b)}
    out += [f"package circle: {' -> '.join(c)}" for c in circles(unit_edges)]
    return out


def circles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """A shortest circle through every node that lies on one (closed: first node repeated), each circle once."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    out: dict[frozenset, list[str]] = {}
    for group in _groups(graph):
        for start in sorted(group):
            circle = _shortest_circle(graph, group, start)
            out.setdefault(frozenset(circle), circle)
    return sorted(out.values())


def _shortest_circle(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """Breadth first from `start` back to itself, inside its strongly connected group (so a way back exists)."""
    came: dict[str, str] = {start: start}
    frontier = [start]
    while True:
        nxt = []
        for a in frontier:
            for b in sorted(graph[a] & group):
                if b == start:
                    path = [a]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return path[::-1] + [start]
                if b not in came:
                    came[b] = a
                    nxt.append(b)
        frontier = nxt


def _groups(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected groups of two or more nodes (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    group = set()
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        group.add(w)
                        if w == v:
                            break
                    if len(group) > 1:
                        groups.append(group)
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return groups


def mermaid(root: Path) -> str:
    """The diagram: one box per layer, its packages inside, an arrow for each package that imports another.
    Imports of the utilities are left out (every layer uses them); an upward arrow would be dotted and red."""
    edges = sorted({(unit(i.src), unit(i.dst)) for i in imports(root)
                    if unit(i.src) != unit(i.dst) and LEVEL.get(unit(i.dst), 0) > 0})
    lines = ["```mermaid", "flowchart BT"]
    for n, (layer, units) in enumerate(LAYERS):
        lines.append(f'  subgraph L{n}["{layer}"]')
        lines += [f"    {u}[{u}]" for u in units]
        lines.append("  end")
    for n in range(len(LAYERS) - 1):
        lines.append(f"  L{n} ~~~ L{n + 1}")  # keep the boxes stacked in order
    up = []
    for k, (a, b) in enumerate(edges):
        if LEVEL.get(b, 0) > LEVEL.get(a, 0):
            up.append(k)
            lines.append(f"  {a} -.->|up| {b}")
        else:
            lines.append(f"  {a} --> {b}")
    if up:
        lines.append(f"  linkStyle {','.join(str(k + len(LAYERS) - 1) for k in up)} stroke:red")
    lines.append("```")
    return "\n".join(lines)


def write(doc: Path, root: Path) -> None:
    """Replace the diagram between the markers of `doc`."""
    text = doc.read_text()
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not (begin and end):
        raise SystemExit(f"{doc}: the markers {BEGIN!r} and {END!r} are missing")
    doc.write_text(f"{head}{BEGIN}\n{mermaid(root)}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(__file__).parent
    if argv[:1] == ["--mermaid"]:
        print(mermaid(root))
        return 0
    if argv[:1] == ["--write"] and len(argv) == 2:
        try:
            write(Path(argv[1]), root)
        except OSError as e:
            print(f"specdec.layers: {argv[1]}: {e.strerror}", file=sys.stderr)
            return 2
        return 0
    if argv:
        print("usage: python -m specdec.layers [--mermaid | --write DOC]", file=sys.stderr)
        return 2
    found = problems(root)
    print("\n".join(found) if found else "specdec.layers: no upward imports, no circles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
