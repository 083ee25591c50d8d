"""Layering: every import inside minite_core points DOWN the layer order of DESIGN.md ("imports point down this
list, never up"), and the CPU path imports without triton.

The order is written once, here (`LAYERS`), as DESIGN.md's layout lists it. DESIGN.md puts diagnostics/, rl/,
eval/ and bench/ on one line; this test orders them (rl logs nothing from diagnostics, but nothing below may
import them), so a cycle between siblings cannot form either. Every `import` counts, including the ones inside
functions: a lazy upward import is still an upward dependency.
"""
import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minite_core"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("formats",),
    ("profiles", "results", "seeds"),
    ("kernels",),
    ("nn",),
    ("model",),
    ("task",),
    ("engines",),
    ("runs",),
    ("peers",),
    ("diagnostics",),
    ("rl",),
    ("eval",),
    ("bench",),
    ("report",),
    # the `minite` dispatcher (imports commands by name); the DAG's config checks; the sweep driver (runs whole
    # experiments as `minite` subprocesses); `minite doctor` (reads the kernels' and profiles' availability)
    ("cli", "experiment", "rule_args", "sweep", "doctor"),
)
RANK = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str | None:
    """minite_core.<unit>[.…] -> unit (a subpackage or a top-level module); None outside the package."""
    parts = module.split(".")
    return parts[1] if parts[0] == "minite_core" and len(parts) > 1 else None


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement in the file, at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            # `from minite_core import x` names a unit through its alias
            if mod == "minite_core":
                out += [(node.lineno, f"minite_core.{alias.name}") for alias in node.names]
    return out


def upward_imports() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        me = _unit(_module_name(path))
        if me is None:  # minite_core/__init__.py
            continue
        assert me in RANK, f"{path}: unit {me!r} is not in the layer order of tests/test_layers.py (DESIGN.md)"
        for line, mod in _imports(path):
            dep = _unit(mod)
            if dep is None or dep == me:
                continue
            assert dep in RANK, f"{path}:{line}: imports {mod}, whose unit {dep!r} is not in the layer order"
            if RANK[dep] > RANK[me]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {me} imports {mod} (layer {dep} is above {me})")
    return bad


def test_every_import_points_down():
    bad = upward_imports()
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_report_reads_only_the_results_contract():
    """report/ builds tables from results files: it may use results.py and the profile names, no stage code."""
    allowed = {"report", "results", "profiles"}
    bad = [f"{p.relative_to(ROOT)}:{line}: {mod}" for p in sorted((PACKAGE / "report").rglob("*.py"))
           for line, mod in _imports(p) if _unit(mod) is not None and _unit(mod) not in allowed]
    assert not bad, "report/ imports stage code:\n" + "\n".join(bad)


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """The test above can fail: a planted upward import (formats -> report), also inside a function, is found."""
    fake = tmp_path / "minite_core" / "formats"
    fake.mkdir(parents=True)
    (fake / "planted.py").write_text("def f():\n    from minite_core.report import build\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "minite_core")
    bad = upward_imports()
    assert len(bad) == 1 and "formats imports minite_core.report" in bad[0]


MAX_LINES = 500  # one concept per file (STYLE.md): 150-500 lines


def module_graph(package: Path) -> dict[str, set[str]]:
    """Every module of the package -> the package's modules it imports, at module level or inside a function.
    `from pkg import name` imports the module pkg.name when there is one, else pkg itself (its __init__)."""
    root = package.parent
    names = {_module_name_under(p, root): p for p in package.rglob("*.py")}
    graph = {}
    for me, path in names.items():
        pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(pkg.split(".")[:len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
                deps |= {f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names}
        graph[me] = {d for d in deps if d in names and d != me}
    return graph


def _module_name_under(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: its strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    """No two modules of minite_core import each other, directly or around a loop, at any depth: a shared part
    lives in a module of its own."""
    cycles = import_cycles(module_graph(PACKAGE))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_checker_sees_a_cycle(tmp_path):
    """The test above can fail: a loop of three modules, one edge inside a function, is found."""
    pkg = tmp_path / "minite_core"
    (pkg / "rl").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "rl" / "__init__.py").write_text("")
    (pkg / "rl" / "a.py").write_text("from minite_core.rl import b\n")
    (pkg / "rl" / "b.py").write_text("from minite_core.rl.c import f\n")
    (pkg / "rl" / "c.py").write_text("def f():\n    from minite_core.rl.a import x\n")
    (pkg / "rl" / "d.py").write_text("from minite_core.rl import a\n")  # into the loop, not part of it
    assert import_cycles(module_graph(pkg)) == [["minite_core.rl.a", "minite_core.rl.b", "minite_core.rl.c"]]


def test_no_file_over_the_line_limit():
    """Every Python file of minite_core has at most MAX_LINES lines (split a longer one by concept)."""
    long = {str(p.relative_to(ROOT)): n for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def kernel_reaches(path: Path) -> list[str]:
    """Every kernels/ module `path` imports (`from minite_core.kernels import x` names x), at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("minite_core.kernels.")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minite_core.kernels"):
            if node.module == "minite_core.kernels":
                out += [f"minite_core.kernels.{a.name}" for a in node.names]
            else:
                out.append(node.module)
    return out


def test_nn_reaches_kernels_only_through_dispatch():
    """nn/ (the autograd layer) calls every kernel through kernels.dispatch, which picks reference or Triton."""
    bad = [f"{p.relative_to(ROOT)}: {mod}" for p in sorted((PACKAGE / "nn").rglob("*.py"))
           for mod in kernel_reaches(p) if mod != "minite_core.kernels.dispatch"]
    assert not bad, "nn/ imports kernels other than dispatch:\n" + "\n".join(bad)


_NO_TRITON = textwrap.dedent('''
    """Stand-in for a machine without triton (the README's main command installs no triton)."""
    raise ImportError("triton is not installed (blocked by tests/test_layers.py)")
''')


def _without_triton_env(tmp_path) -> dict:
    (tmp_path / "triton.py").write_text(_NO_TRITON)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("TRITON_INTERPRET", None)
    return env


def _is_triton_kernel_file(path: Path) -> bool:
    """A file of kernels/ that imports triton at module level: a Triton kernel file, imported only when the
    triton / native backend is chosen (kernels.dispatch imports it lazily)."""
    if path.parent.name != "kernels":
        return False
    tree = ast.parse(path.read_text())
    return any(isinstance(n, (ast.Import, ast.ImportFrom)) and any(
        (a.name if isinstance(n, ast.Import) else (n.module or "")).split(".")[0] == "triton" for a in n.names)
        for n in tree.body)


def test_cpu_path_imports_without_triton(tmp_path):
    """Nothing on the CPU path imports triton. Every minite_core module except the Triton kernel
    files themselves must import with triton unimportable, and `snakemake -n` must parse the DAG. (Not xfailed,
    ever: while it fails, the README's main command is broken on a fresh machine, which installs no triton.)"""
    modules = sorted(_module_name(p) for p in PACKAGE.rglob("*.py") if not _is_triton_kernel_file(p))
    code = textwrap.dedent(f"""
        import importlib, sys
        failed = []
        for name in {modules!r}:
            try:
                importlib.import_module(name)
            except ImportError as e:
                if "triton" in str(e):
                    failed.append(f"{{name}}: {{e}}")
        if failed:
            sys.exit("modules that need triton at import time:\\n" + "\\n".join(failed))
    """)
    env = _without_triton_env(tmp_path)
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    dry = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--quiet", "all"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-4000:]


def test_run_options_import_no_triton():
    """The run options (runs.cli, which every command parses before it acts) import neither triton nor the model
    code: `minite kernels` turns the Triton interpreter on (TRITON_INTERPRET=1) after parsing them, and triton
    reads the variable when it is first imported."""
    code = "import sys, minite_core.runs.cli; print(sorted(m for m in ('triton', 'transformers') if m in sys.modules))"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]", res.stdout


@pytest.mark.parametrize("unit", sorted(RANK))
def test_layer_units_exist(unit):
    assert (PACKAGE / unit).is_dir() or (PACKAGE / f"{unit}.py").is_file(), f"{unit} is in LAYERS but not in the package"
