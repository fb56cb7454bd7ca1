"""The package's import graph keeps its layers (specdec/layers.py): no import runs up a layer or through the root
package, no circle joins two modules or two packages, and docs/architecture.md draws the imports as they are."""

from __future__ import annotations

from pathlib import Path

from specdec import layers

ROOT = Path(layers.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"


def _breaches(kind: str) -> list[str]:
    return [p for p in layers.problems(ROOT) if kind in p]


def test_every_package_has_a_layer():
    found = _breaches("not in the layer table")
    assert not found, "\n".join(found)


def test_no_import_runs_up_a_layer():
    found = _breaches("upward:")
    assert not found, "imports that run up a layer (bottom to top: " + " -> ".join(
        f"{name} {'/'.join(units)}" for name, units in layers.LAYERS) + "):\n" + "\n".join(found)


def test_no_circle_between_modules():
    found = _breaches("module circle:")
    assert not found, "\n".join(found)


def test_no_circle_between_packages():
    found = _breaches("package circle:")
    assert not found, "\n".join(found)


def test_the_architecture_page_draws_todays_imports():
    text = DOC.read_text()
    assert layers.BEGIN in text and layers.END in text, f"{DOC}: the diagram's markers are missing"
    drawn = text.split(layers.BEGIN, 1)[1].split(layers.END, 1)[0].strip()
    assert drawn == layers.mermaid(ROOT), "the diagram is stale: python -m specdec.layers --write docs/architecture.md"


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "specdec" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "specdec"


def test_the_rules_catch_each_kind_of_breach(tmp_path):
    """A small package with one of each: an upward import, an import through the root, a lazy circle between two
    modules, a circle between two packages of one layer (relative imports), and a package the table lacks."""
    root = _package(tmp_path, {
        "__init__.py": "from specdec.errors import SpecdecError\n",
        "errors.py": "",
        "measure.py": "",
        "kernels/__init__.py": "def f():\n    from specdec.models.loader import load\n",
        "models/__init__.py": "",
        "models/loader.py": "from specdec.errors import SpecdecError\nfrom specdec.models import gemma3\n",
        "models/gemma3.py": "def g():\n    from .loader import load\n",
        "engine/stats.py": "from specdec import measure\n",
        "bench/__init__.py": "", "bench/a.py": "from ..serve import b\n",
        "serve/__init__.py": "", "serve/b.py": "from specdec.bench.a import x\n",
        "mystery/__init__.py": "import specdec.engine.stats\n",
    })
    found = layers.problems(root)
    assert found == [
        "mystery: not in the layer table (specdec/layers.py LAYERS)",
        "upward: specdec.engine.stats (line 1, engine) imports specdec (entry points) (through the root package: "
        "import the defining module)",
        "upward: specdec.kernels (line 2, kernels) imports specdec.models.loader (models)",
        "module circle: specdec.bench.a -> specdec.serve.b -> specdec.bench.a",
        "module circle: specdec.models.gemma3 -> specdec.models.loader -> specdec.models.gemma3",
        "package circle: bench -> serve -> bench",
    ], "\n".join(found)


def test_a_clean_package_passes_and_is_drawn(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "from specdec.sampling import verify\n", "errors.py": "",
        "sampling/__init__.py": "", "sampling/verify.py": "from specdec.errors import SpecdecError\n",
        "engine/__init__.py": "", "engine/run.py": "from specdec.sampling.verify import v\nimport specdec.errors\n",
    })
    assert layers.problems(root) == []
    drawn = layers.mermaid(root)
    assert "  engine --> sampling" in drawn and "errors" not in drawn.split("end\n")[-1]  # utilities: no arrows
    assert "-.->" not in drawn


MAX_MODULES, MAX_FUNCTION_LINES = 15, 80  # issue 51's bounds: a folder read in one sitting, a function on a screen


def test_no_folder_holds_more_than_15_modules():
    crowded = {str(d.relative_to(ROOT.parent)): n for d in [ROOT, *ROOT.rglob("*/")] if d.is_dir()
               and (n := len(list(d.glob("*.py")))) > MAX_MODULES}
    assert not crowded, f"folders with more than {MAX_MODULES} modules: {crowded} (split them by what they hold)"


def test_no_function_is_longer_than_80_lines():
    import ast

    long = [f"{p.relative_to(ROOT.parent)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p in ROOT.rglob("*.py") for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "\n".join(long)


def test_a_model_or_policy_is_probed_only_by_the_declared_interface():
    """getattr/hasattr on a model or a policy (a name or an attribute called model, target or policy) only in
    models/target.py, where TargetTraits declares what may be asked of a target."""
    import ast

    def probed(arg) -> bool:
        name = arg.id if isinstance(arg, ast.Name) else arg.attr if isinstance(arg, ast.Attribute) else ""
        return name in ("model", "target", "policy")

    found = [f"{p.relative_to(ROOT.parent)}:{n.lineno}" for p in ROOT.rglob("*.py") if p.name != "target.py"
             for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id in ("getattr", "hasattr") and n.args and probed(n.args[0])]
    assert not found, "probes outside models/target.py (declare the field on TargetTraits): " + ", ".join(found)
