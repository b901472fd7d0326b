"""Import contracts between the layers (issue #23): every `import` node is walked, function-level ones included.

Layers of sweeps/, lowest first (docs/design.md section 2): a module imports only from its own layer or
lower ones. calib_core imports nothing of sweeps, ray, optuna or mlflow; checks/, decide/ and report/ import
none of ray, optuna or mlflow (nor the integrations); and no module is part of an import cycle.
Issue #33: each integration (integrations/ray, mlflow, optuna) imports no other one, what they share lives
below them; sweeps/contract.py, the bottom of layer 0, imports the standard library only; and no module
imports an underscore name from another package of sweeps/. Each of these three rules is shown failing on a
planted import.
Issue #45: benchmarks/ has no import cycle either (a study imports the module it shares code from, never its caller),
shown failing on a planted cycle and on a small made-up graph.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.paths import ROOT

THIRD_PARTY_SERVICES = ("ray", "optuna", "mlflow")

# (layer, module prefixes); a module belongs to the first layer whose prefix it starts with
LAYERS: list[tuple[int, tuple[str, ...]]] = [
    (
        0,
        (
            "sweeps.contract",
            "sweeps.sweep_lock",
            "sweeps.outage",
            "sweeps.run_notes",
            "sweeps.selection_rules",
            "sweeps.start_steps",
        ),
    ),
    (1, ("sweeps.config", "sweeps.config_evaluation", "sweeps.trial_params")),
    (2, ("sweeps.checks", "sweeps.decide")),
    (3, ("sweeps.report",)),
    (4, ("sweeps.integrations",)),
    (5, ("sweeps.service", "sweeps.service_start", "sweeps.finish", "sweeps.closing_warmup")),
    (6, ("sweeps.cli", "sweeps.api", "sweeps.launch", "sweeps")),
]


def _modules(packages: tuple[str, ...] = ("calib_core", "sweeps")) -> dict[str, Path]:
    out = {}
    for pkg in packages:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = p
    return out


MODULES = _modules()
BENCHMARK_MODULES = _modules(("benchmarks",))


def _from_module(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module name of a `from ... import` node in module `name` (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = name.split(".")
    base = base[: len(base) - node.level + (1 if path.name == "__init__.py" else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(name: str, path: Path, modules: dict[str, Path] = MODULES) -> set[str]:
    """Every module name an import node in `path` refers to (`from pkg import sub` resolves to pkg.sub when
    `modules` holds pkg.sub)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = _from_module(name, path, node)
            subs = [f"{mod}.{a.name}" for a in node.names]
            known = [s for s in subs if s in modules]
            out.update(known)
            if len(known) < len(subs):
                out.add(mod)
    return out


def _project_deps(name: str, modules: dict[str, Path] = MODULES) -> set[str]:
    """The modules of `modules` that module `name` imports (an import of pkg.mod.attr counts as pkg.mod)."""
    deps = set()
    for imp in _imports(name, modules[name], modules):
        parts = imp.split(".")
        for k in range(len(parts), 0, -1):
            cand = ".".join(parts[:k])
            if cand in modules:
                deps.add(cand)
                break
    deps.discard(name)
    return deps


def _layer(name: str) -> int | None:
    for rank, prefixes in LAYERS:
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return rank
    return None


def test_calib_core_imports_no_service_library_and_nothing_of_sweeps():
    bad = [
        f"{n} imports {i}"
        for n, p in MODULES.items()
        if n.startswith("calib_core")
        for i in _imports(n, p)
        if i.split(".")[0] in (*THIRD_PARTY_SERVICES, "sweeps")
    ]
    assert not bad, "\n".join(bad)


def test_checks_decide_and_report_import_neither_services_nor_integrations():
    bad = [
        f"{n} imports {i}"
        for n, p in MODULES.items()
        if n.startswith(("sweeps.checks", "sweeps.decide", "sweeps.report"))
        for i in _imports(n, p)
        if i.split(".")[0] in THIRD_PARTY_SERVICES or i.startswith(("sweeps.integrations", "sweeps.service"))
    ]
    assert not bad, "\n".join(bad)


def test_every_sweeps_module_has_a_layer_and_imports_only_down():
    unplaced = [n for n in MODULES if n.startswith("sweeps") and _layer(n) is None]
    assert not unplaced, unplaced
    up = [
        f"{n} (layer {_layer(n)}) imports {d} (layer {_layer(d)})"
        for n in MODULES
        if n.startswith("sweeps")
        for d in _project_deps(n)
        if d.startswith("sweeps") and (_layer(d) or 0) > (_layer(n) or 0)
    ]
    assert not up, "\n".join(sorted(up))


def _integration(module: str) -> str | None:
    """The integration a module name belongs to (sweeps.integrations.ray.tuner -> "ray"), else None."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["sweeps", "integrations"] and len(parts) > 2 else None


def _cross_integration_imports(modules: dict[str, Path]) -> list[str]:
    """Each import of a module of one integration (sweeps.integrations.X) from another (sweeps.integrations.Y)."""
    return sorted(
        f"{n} imports {i}"
        for n, p in modules.items()
        if _integration(n) is not None
        for i in _imports(n, p)
        if _integration(i) not in (None, _integration(n))
    )


# what sweeps.contract may import: the standard library, nothing else (no layer lies below it, and its own
# layer's other modules may import calib_core)
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


def _contract_imports_beyond_stdlib(modules: dict[str, Path]) -> list[str]:
    """Each import of sweeps.contract not of the standard library (a third-party library, sweeps, calib_core)."""
    name = "sweeps.contract"
    return sorted(f"{name} imports {i}" for i in _imports(name, modules[name]) if i.split(".")[0] not in STDLIB)


def _package(module: str) -> str:
    """The package a module lives in (a package is its own)."""
    path = MODULES.get(module)
    return module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]


def _private_imports_across_packages(modules: dict[str, Path]) -> list[str]:
    """Each `from sweeps.<package>.m import _name` in a module of sweeps/ outside that package."""
    bad = []
    for n, p in modules.items():
        if not n.startswith("sweeps"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            mod = _from_module(n, p, node)
            if not mod.startswith("sweeps") or _package(mod) == _package(n):
                continue
            bad += [
                f"{n} imports {mod}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__") and f"{mod}.{a.name}" not in MODULES
            ]
    return sorted(bad)


def test_no_integration_imports_another():
    """integrations/ray, mlflow and optuna stand apart (issue #33): what two of them share lives below layer 4."""
    bad = _cross_integration_imports(MODULES)
    assert not bad, "\n".join(bad)


def test_contract_imports_the_standard_library_only():
    bad = _contract_imports_beyond_stdlib(MODULES)
    assert not bad, "\n".join(bad)


def test_no_private_helper_is_imported_across_packages():
    bad = _private_imports_across_packages(MODULES)
    assert not bad, "\n".join(bad)


def _planted(tmp_path: Path, module: str, lines: str, modules: dict[str, Path] = MODULES) -> dict[str, Path]:
    """`modules` with `module` replaced by a copy of its source that has `lines` appended."""
    copy = tmp_path / (module.replace(".", "_") + ".py")
    copy.write_text(modules[module].read_text() + "\n\n" + lines)
    return {**modules, module: copy}


def test_the_rules_fail_on_planted_imports(tmp_path):
    """Each issue #33 rule finds an import planted in a copy of a real module, in a function too."""
    ray_to_mlflow = _planted(
        tmp_path,
        "sweeps.integrations.ray.tuner",
        "def _planted():\n    from sweeps.integrations.mlflow.store import MlflowStore\n\n\n"
        "from ..mlflow import tracking\n",
    )
    assert _cross_integration_imports(ray_to_mlflow) == [
        "sweeps.integrations.ray.tuner imports sweeps.integrations.mlflow.store",
        "sweeps.integrations.ray.tuner imports sweeps.integrations.mlflow.tracking",
    ]
    contract = _planted(
        tmp_path, "sweeps.contract", "def _planted():\n    import optuna\n    from sweeps.config import SweepConfig\n"
    )
    assert _contract_imports_beyond_stdlib(contract) == [
        "sweeps.contract imports optuna",
        "sweeps.contract imports sweeps.config",
    ]
    private = _planted(tmp_path, "sweeps.integrations.ray.cluster", "from sweeps.checks.servers import _probe_http\n")
    assert _private_imports_across_packages(private) == [
        "sweeps.integrations.ray.cluster imports sweeps.checks.servers._probe_http"
    ]


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of a graph (module -> the modules it imports): each strongly connected component of more
    than one module, sorted (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # recursive: deep enough for these graphs
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {n: _project_deps(n, modules) for n in modules}


def test_no_import_cycles():
    assert import_cycles(_graph(MODULES)) == []


def test_benchmarks_has_no_import_cycle():
    """Issue #45 item 5: no module of benchmarks/ takes part in an import cycle (function-level imports count)."""
    assert len(BENCHMARK_MODULES) > 20 and "benchmarks.studies.selection_v3" in BENCHMARK_MODULES
    assert import_cycles(_graph(BENCHMARK_MODULES)) == []


def test_the_cycle_check_fails_on_a_planted_cycle(tmp_path):
    """A made-up graph's cycles are found (and a chain is not one); so is a cycle planted in a copy of a real module
    of benchmarks/, through a function-level import, like the two issue #45 removed."""
    made_up = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": set(), "f": {"g"}, "g": {"f"}}
    assert import_cycles(made_up) == [["a", "b", "c"], ["f", "g"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    slice_, full = "benchmarks.studies.method_study_c_slice", "benchmarks.studies.method_study_c_full"
    assert slice_ in _project_deps(full, BENCHMARK_MODULES)  # the full factorial is built on the slice's functions
    planted = _planted(
        tmp_path, slice_, "def _planted():\n    from benchmarks.studies import method_study_c_full\n", BENCHMARK_MODULES
    )
    cycles = import_cycles(_graph(planted))
    assert [full, slice_] in cycles or any({full, slice_} <= set(c) for c in cycles), cycles


def test_the_walker_sees_function_level_imports(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f():\n    import ray\n    from sweeps.decide import selection\n")
    assert {"ray", "sweeps.decide.selection"} <= _imports("x.m", p)


def test_design_module_map_lists_every_sweeps_module():
    """docs/design.md section 2 names each module of sweeps/ where it lives (issue #23 item 8)."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("## 2.") : text.index("## 3.")]
    missing = []
    for p in sorted((ROOT / "sweeps").rglob("*.py")):
        if p.name == "__init__.py":
            continue
        rel = p.relative_to(ROOT / "sweeps")
        # shown as its path below its layer folder (integrations/ray/x.py as ray/x.py) or by its name
        shown = "/".join(rel.parts[-2:]) if rel.parts[0] == "integrations" else p.name
        if shown not in section:
            missing.append(str(rel))
    assert not missing, missing


# Sizes a newcomer can read (issue #33): a module of sweeps/ at most this many lines, a function at most this many.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 80


def _too_long(text: str) -> list[tuple[str, int, int]]:
    """(name, first line, length) of each function of `text` over MAX_FUNCTION_LINES."""
    return [
        (node.name, node.lineno, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def _oversized(modules: dict[str, Path]) -> list[str]:
    out = []
    for name, path in sorted(modules.items()):
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            out.append(f"{name}: {text.count(chr(10))} lines")
        out += [f"{name}.{fn}: {length} lines" for fn, _, length in _too_long(text)]
    return out


def test_sweeps_modules_and_functions_stay_readable(tmp_path):
    """No module of sweeps/ over 450 lines, no function over 80; a planted long function and module are named."""
    assert _oversized({n: p for n, p in MODULES.items() if n.startswith("sweeps")}) == []
    long_fn = tmp_path / "long.py"
    long_fn.write_text("def f():\n" + "    x = 1\n" * 80 + "\n" * 400)
    assert _oversized({"sweeps.long": long_fn}) == ["sweeps.long: 481 lines", "sweeps.long.f: 81 lines"]


# Exempt from the function length: numba kernels (written out loop by loop for the compiler, built in one
# closure) and code vendored unchanged from a reference library.
LONG_FUNCTIONS_ALLOWED_IN = ("calib_core/metrics/_fast.py", "tests/reference/_vendor/")


def _long_functions(paths: list[Path], root: Path = ROOT) -> list[str]:
    return [
        f"{path.relative_to(root)}:{line} {fn}: {length} lines"
        for path in paths
        for fn, line, length in _too_long(path.read_text())
    ]


def test_no_function_anywhere_is_over_80_lines(tmp_path):
    """calib_core, sweeps, benchmarks and the tests: no function over 80 lines (numba kernels and vendored
    reference code aside); a planted one is named with its place."""
    paths = [
        p
        for pkg in ("calib_core", "sweeps", "benchmarks", "tests")
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if not str(p.relative_to(ROOT)).startswith(LONG_FUNCTIONS_ALLOWED_IN)
    ]
    assert len(paths) > 300
    assert _long_functions(paths) == []
    planted = tmp_path / "planted.py"
    planted.write_text("import os\n\n\ndef g():\n" + "    x = 1\n" * 80)
    assert _long_functions([planted], tmp_path) == ["planted.py:4 g: 81 lines"]
