"""Unit tests of the small Kustomize renderer (tests/deploy_render.py) the deploy tests rely on."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml


from tests import deploy_render as dr  # noqa: E402


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


DEPLOYMENT = """\
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: web
    spec:
      selector:
        matchLabels: {app: web}
      template:
        metadata:
          labels: {app: web}
        spec:
          containers:
            - name: web
              image: example/web:1.0
              env:
                - {name: A, value: "1"}
                - {name: B, value: "2"}
              envFrom:
                - configMapRef: {name: settings}
            - name: sidecar
              image: example/sidecar
    """

RAYJOB = """\
    apiVersion: ray.io/v1
    kind: RayJob
    metadata:
      name: job
    spec:
      entrypoint: python main.py
      rayClusterSpec:
        headGroupSpec:
          template:
            spec:
              containers:
                - name: head
                  image: example/web:1.0
                  env: [{name: A, value: "1"}, {name: B, value: "2"}]
    """


def test_strategic_merge_lists_by_name_and_deletes(tmp_path):
    _write(tmp_path, {
        "base/kustomization.yaml": "resources: [deploy.yaml]\n",
        "base/deploy.yaml": DEPLOYMENT,
        "over/kustomization.yaml": """\
            resources: [../base]
            namespace: team
            patches:
              - path: patch.yaml
            """,
        "over/patch.yaml": """\
            apiVersion: apps/v1
            kind: Deployment
            metadata: {name: web}
            spec:
              template:
                spec:
                  containers:
                    - name: web
                      env:
                        - {name: B, value: "20"}
                        - {name: C, value: "3"}
                    - name: sidecar
                      $patch: delete
            """,
    })
    (dep,) = dr.build(tmp_path / "over")
    assert dep["metadata"]["namespace"] == "team"
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["web"]
    assert containers[0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "20"}, {"name": "C", "value": "3"}]


def test_custom_resources_get_json_merge_patch_and_json6902(tmp_path):
    _write(tmp_path, {
        "kustomization.yaml": """\
            resources: [job.yaml]
            patches:
              - patch: |
                  apiVersion: ray.io/v1
                  kind: RayJob
                  metadata: {name: job}
                  spec:
                    rayClusterSpec:
                      headGroupSpec:
                        template:
                          spec:
                            containers:
                              - name: head
                                env: [{name: C, value: "3"}]
              - target: {group: ray.io, version: v1, kind: RayJob, name: job}
                patch: |
                  - op: replace
                    path: /spec/entrypoint
                    value: python other.py
                  - op: add
                    path: /spec/shutdownAfterJobFinishes
                    value: true
            """,
        "job.yaml": RAYJOB,
    })
    (job,) = dr.build(tmp_path)
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    # RFC 7386 for kinds kustomize has no schema for: the list is replaced, not merged.
    assert head == {"name": "head", "env": [{"name": "C", "value": "3"}]}
    assert job["spec"]["entrypoint"] == "python other.py"
    assert job["spec"]["shutdownAfterJobFinishes"] is True


def test_json6902_errors_on_missing_path():
    with pytest.raises(KeyError):
        dr.json6902({"spec": {}}, [{"op": "replace", "path": "/spec/missing", "value": 1}])
    with pytest.raises(KeyError):
        dr.json6902({"spec": {}}, [{"op": "remove", "path": "/spec/missing"}])
    assert dr.json6902({"a": [1, 2]}, [{"op": "add", "path": "/a/-", "value": 3}]) == {"a": [1, 2, 3]}


def test_images_labels_and_hashed_generator_references(tmp_path):
    _write(tmp_path, {
        "kustomization.yaml": """\
            resources: [deploy.yaml, job.yaml]
            labels:
              - pairs: {team: ml}
                includeTemplates: true
            configMapGenerator:
              - name: settings
                literals: [X=1]
            images:
              - name: example/web
                newName: registry.local/web
                newTag: "2.0"
            """,
        "deploy.yaml": DEPLOYMENT,
        "job.yaml": RAYJOB,
    })
    out = {r["kind"]: r for r in dr.build(tmp_path)}
    dep, job, cm = out["Deployment"], out["RayJob"], out["ConfigMap"]
    assert dep["metadata"]["labels"] == {"team": "ml"}
    assert dep["spec"]["template"]["metadata"]["labels"] == {"app": "web", "team": "ml"}
    assert dep["spec"]["selector"]["matchLabels"] == {"app": "web"}  # includeSelectors: false
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/web:2.0"
    assert dep["spec"]["template"]["spec"]["containers"][1]["image"] == "example/sidecar"
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"] == "registry.local/web:2.0"  # images reach containers of custom resources
    assert cm["metadata"]["name"].startswith("settings-") and len(cm["metadata"]["name"]) == len("settings-") + 10
    assert dep["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"] == cm["metadata"]["name"]
    assert "annotations" not in cm["metadata"]


def test_generator_merge_and_unsupported_fields(tmp_path):
    _write(tmp_path, {
        "base/kustomization.yaml": """\
            configMapGenerator:
              - name: env
                options: {disableNameSuffixHash: true}
                literals: [A=1, B=2]
            """,
        "over/kustomization.yaml": """\
            resources: [../base]
            configMapGenerator:
              - name: env
                behavior: merge
                options: {disableNameSuffixHash: true}
                literals: [B=20, C=3]
            """,
        "bad/kustomization.yaml": "resources: []\nreplicas: [{name: x, count: 2}]\n",
    })
    (cm,) = dr.build(tmp_path / "over")
    assert cm["metadata"]["name"] == "env"
    assert cm["data"] == {"A": "1", "B": "20", "C": "3"}
    with pytest.raises(dr.UnsupportedKustomization):
        dr.build(tmp_path / "bad")


def test_cli_prints_a_yaml_stream(tmp_path, capsys):
    _write(tmp_path, {"kustomization.yaml": "resources: [deploy.yaml]\n", "deploy.yaml": DEPLOYMENT})
    assert dr.main([str(tmp_path)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["Deployment"]
