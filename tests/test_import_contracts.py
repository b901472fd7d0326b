"""Import contracts between the layers (issue #23): every `import` node is walked, function-level ones included.

Layers of sweeps/, lowest first (docs/design.md section 2): a module imports only from its own layer or
lower ones. calib_core imports nothing of sweeps, ray, optuna or mlflow; checks/, decide/ and report/ import
none of ray, optuna or mlflow (nor the integrations); and no module is part of an import cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THIRD_PARTY_SERVICES = ("ray", "optuna", "mlflow")

# (layer, module prefixes); a module belongs to the first layer whose prefix it starts with
LAYERS: list[tuple[int, tuple[str, ...]]] = [
    (0, ("sweeps.contract", "sweeps.redaction", "sweeps.sweep_lock", "sweeps.outage", "sweeps.run_notes")),
    (1, ("sweeps.config", "sweeps.trial_params")),
    (2, ("sweeps.checks", "sweeps.decide")),
    (3, ("sweeps.report",)),
    (4, ("sweeps.integrations",)),
    (5, ("sweeps.service", "sweeps.finish")),
    (6, ("sweeps.cli", "sweeps.api", "sweeps.launch", "sweeps")),
]


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in ("calib_core", "sweeps"):
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module name an import node in `path` refers to (`from pkg import sub` resolves to pkg.sub)."""
    out: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names]
            known = [s for s in subs if s in MODULES]
            out.update(known)
            if len(known) < len(subs):
                out.add(mod)
    return out


def _project_deps(name: str) -> set[str]:
    deps = set()
    for imp in _imports(name, MODULES[name]):
        parts = imp.split(".")
        for k in range(len(parts), 0, -1):
            cand = ".".join(parts[:k])
            if cand in MODULES:
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


def test_no_import_cycles():
    graph = {n: _project_deps(n) for n in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components, iterative enough for this graph
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
    assert not cycles, cycles


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
