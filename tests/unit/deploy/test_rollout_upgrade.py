"""deploy/UPGRADING.md's version table is the truth: every place a Ray, MLflow or KubeRay version is
written (constraints.txt, the hash locks, the Dockerfile's build checks, rayVersion and the Ray images of the
rendered overlays, the recorded Ray ports, the KubeRay chart and the vendored CRDs) agrees with it, and
a planted disagreement in any of them is reported."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from tests import deploy_render as dr

REPO, DEPLOY = dr.REPO_ROOT, dr.DEPLOY
UPGRADING = DEPLOY / "UPGRADING.md"
RAY_TAG = re.compile(r"(?:^|/)rayproject/ray:(\d+\.\d+\.\d+)-py3\d+-cpu(?:@sha256:[0-9a-f]{64})?$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)", line.split("#", 1)[0].strip())
        if m:
            out[_norm(m.group(1))] = m.group(2)
    return out


def stated_versions(text: str | None = None) -> dict[str, str]:
    """{component: version} from UPGRADING.md's "Current versions" table."""
    text = UPGRADING.read_text() if text is None else text
    section = text.split("## Current versions", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"\d+\.\d+\.\d+", cells[1]):
            out[cells[0]] = cells[1]
    return out


def written_versions() -> dict[str, list[tuple[str, str]]]:
    """{component: [(where, version), ...]} for every place deploy/, docker/ and the tests write one."""
    found: dict[str, list[tuple[str, str]]] = {"ray": [], "mlflow": [], "kuberay": []}
    constraints = _pins(REPO / "constraints.txt")
    ray_lock = _pins(REPO / "docker" / "locks" / "ray-image.txt")
    mlflow_lock = _pins(REPO / "docker" / "locks" / "mlflow-image.txt")
    found["ray"] += [("constraints.txt", constraints.get("ray", "?")), ("ray-image lock", ray_lock.get("ray", "?"))]
    for pkg in ("mlflow", "mlflow-skinny", "mlflow-tracing"):
        found["mlflow"].append((f"constraints.txt {pkg}", constraints.get(pkg, "?")))
        for lock_name, lock in (("mlflow-image lock", mlflow_lock), ("ray-image lock", ray_lock)):
            if pkg in lock:
                found["mlflow"].append((f"{lock_name} {pkg}", lock[pkg]))
    # docker/Dockerfile installs Ray from the lock (no Ray base image) and checks the version it built
    dockerfile = re.sub(r"\\\n\s*", " ", (REPO / "docker" / "Dockerfile").read_text())
    for line in dockerfile.splitlines():
        if line.lstrip().startswith("RUN "):
            for v in re.findall(r"(?:\^ray==|ray\.__version__ == ')(\d+\.\d+\.\d+)", line):
                found["ray"].append(("docker/Dockerfile build check", v))
    for overlay in dr.overlay_dirs():
        for r in dr.render(overlay):
            spec = dr.ray_cluster_spec(r)
            if spec is None:
                continue
            where = f"{overlay.name}: {r['kind']}/{r['metadata']['name']}"
            found["ray"].append((f"{where} rayVersion", str(spec.get("rayVersion"))))
            images = [("autoscaler", (spec.get("autoscalerOptions") or {}).get("image"))]
            if r["kind"] == "RayJob" and "submitterPodTemplate" in r["spec"]:
                images += [
                    (f"submitter/{c['name']}", c["image"])
                    for c in r["spec"]["submitterPodTemplate"]["spec"]["containers"]
                ]
            for role, image in images:
                if image and "rayproject/ray" in image:
                    m = RAY_TAG.search(image)
                    found["ray"].append((f"{where} {role} image", m.group(1) if m else image))
    ports = json.loads((REPO / "tests" / "containers" / "ray_ports.json").read_text())
    found["ray"].append(("tests/containers/ray_ports.json", ports["ray_version"]))
    m = re.search(r"kuberay/kuberay-operator --version (\S+)", (DEPLOY / "README.md").read_text())
    found["kuberay"].append(("deploy/README.md helm --version", m.group(1) if m else "?"))
    for d in sorted((DEPLOY / "schemas").glob("kuberay-v*")):
        found["kuberay"].append((f"deploy/schemas/{d.name}", d.name.removeprefix("kuberay-v")))
    k8s_tests = REPO / "tests" / "unit" / "deploy" / "test_deploy_k8s.py"
    m = re.search(r'^KUBERAY_VERSION[^=]*= "v?([^"]+)"', k8s_tests.read_text(), re.M)
    found["kuberay"].append(("tests/unit/deploy/test_deploy_k8s.py KUBERAY_VERSION", m.group(1) if m else "?"))
    return found


def disagreements(stated: dict[str, str], written: dict[str, list[tuple[str, str]]]) -> list[str]:
    out = []
    for component, places in written.items():
        want = stated.get(component)
        if want is None:
            out.append(f"deploy/UPGRADING.md states no {component} version")
            continue
        if not places:
            out.append(f"no place writes a {component} version (the reader is out of date)")
        out += [f"{component}: {where} says {v}, UPGRADING.md {want}" for where, v in places if v != want]
    return out


def test_every_written_version_agrees_with_upgrading_md():
    stated, written = stated_versions(), written_versions()
    assert set(stated) == {"ray", "mlflow", "kuberay"}, stated
    # the reader finds each kind of place (a place it stopped finding would pass silently)
    wheres = {c: " | ".join(w for w, _ in places) for c, places in written.items()}
    for needle in (
        "constraints.txt",
        "ray-image lock",
        "Dockerfile build check",
        "RayJob/calib-sweep rayVersion",
        "RayCluster/calib-interactive rayVersion",
        "ray_ports.json",
    ):
        assert needle in wheres["ray"], (needle, wheres["ray"])
    assert "mlflow-image lock mlflow" in wheres["mlflow"] and "ray-image lock mlflow" in wheres["mlflow"]
    assert "helm --version" in wheres["kuberay"] and "deploy/schemas/kuberay-v" in wheres["kuberay"]
    assert disagreements(stated, written) == []


@pytest.mark.parametrize(
    "component, index_of_place",
    [
        ("ray", 0),
        ("ray", 1),
        ("ray", 2),
        ("ray", 3),
        ("ray", -1),
        ("mlflow", 0),
        ("mlflow", 1),
        ("kuberay", 0),
        ("kuberay", 1),
    ],
)
def test_a_single_disagreeing_place_is_reported(component, index_of_place):
    stated, written = stated_versions(), written_versions()
    planted = copy.deepcopy(written)
    where, _ = planted[component][index_of_place]
    planted[component][index_of_place] = (where, "99.0.0")
    problems = disagreements(stated, planted)
    assert len(problems) == 1 and where in problems[0], problems


def test_a_bump_stated_but_not_made_is_reported():
    stated = stated_versions()
    assert disagreements({**stated, "ray": "2.61.0"}, written_versions())
    assert "no mlflow" in " ".join(
        disagreements({k: v for k, v in stated.items() if k != "mlflow"}, written_versions())
    )


def test_the_table_parser_reads_the_markdown():
    text = (
        "x\n## Current versions\n| Component | Version | Written in |\n| --- | --- | --- |\n"
        "| ray | 1.2.3 | a |\n## Next\n| kuberay | 9.9.9 | b |\n"
    )
    assert stated_versions(text) == {"ray": "1.2.3"}
