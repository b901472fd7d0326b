"""Kustomize rendering for the deploy tests: `render(DIR)` runs the real `kubectl kustomize DIR`
when a kubectl with kustomize >= v5 is on PATH, and falls back to the small Python renderer
below (`build(DIR)`) only when it is not, so the tests also run where kubectl is missing.
`CALIB_KUSTOMIZE=kubectl` requires kubectl (an error without it), `CALIB_KUSTOMIZE=python`
forces the fallback. Where the two disagree, kubectl is right (tests/test_deploy_render.py
checks they agree on every overlay and on its own cases).

The Python renderer implements the features deploy/ uses.

Supported in kustomization.yaml (anything else raises ``UnsupportedKustomization``):
  resources (files with one or more YAML documents, or directories with a kustomization),
  configurations (transformer configuration files; their ``images`` field specs, ``path`` and
  ``kind``, add where the images transformer looks besides containers lists, in this kustomization
  and every one that includes it, as kustomize merges them upward),
  components (directories whose ``kind: Component`` kustomization runs its resources, generators
  and transformers on what the including kustomization accumulated so far, after its resources
  and before its own generators, in the order listed, as kustomize does),
  namespace, labels (pairs / includeSelectors / includeTemplates), commonLabels,
  commonAnnotations, images (name / newName / newTag / digest), configMapGenerator and
  secretGenerator (literals / files / envs, behavior create|merge|replace, options
  disableNameSuffixHash / labels / annotations, generatorOptions), patches (``path`` or inline
  ``patch``; JSON6902 operation lists or strategic-merge patches; ``target`` by group / version /
  kind / name (regex) / namespace / labelSelector).

Transformers run in kustomize's order: patches, namespace, labels, annotations, images; the
output is sorted in kustomize's legacy order (by kind: Namespace, ConfigMap, Secret, Service,
Deployment, StatefulSet, ..., other kinds by group_version_kind, then namespace and name).
Strategic merge follows kustomize: built-in kinds merge lists by their merge keys (containers,
env, volumes by name, volumeMounts by mountPath, ports by containerPort / port; the patch's
items come first, in the patch's order, then the other items of the base, as kustomize orders
them) and understand ``$patch: delete`` and ``null``; custom resources (e.g. ray.io RayJob) get a JSON merge patch
(RFC 7386: maps merge, lists are replaced), as kustomize does for kinds it has no schema for.
Generated ConfigMaps/Secrets get kustomize's content-hash suffix unless disabled, and references
to them in built-in pod templates are renamed (as kustomize does; custom resources are not
touched, which is why deploy/ disables the suffix for what the RayJob reads).

CLI: ``python tests/deploy_render.py deploy/overlays/dev`` prints the rendered YAML stream (the
Python renderer's; ``kubectl kustomize deploy/overlays/dev`` prints the real one).
"""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_KEYS = {
    "apiVersion",
    "kind",
    "resources",
    "components",
    "namespace",
    "labels",
    "commonLabels",
    "commonAnnotations",
    "images",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "patches",
    "configurations",
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "IngressClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "RuntimeClass",
}
# Kinds whose pod template lives at spec.template (or deeper for CronJob).
WORKLOAD_TEMPLATE_PATHS = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
BUILTIN_GROUPS = {
    "",
    "apps",
    "batch",
    "networking.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "autoscaling",
    "storage.k8s.io",
    "scheduling.k8s.io",
    "coordination.k8s.io",
}
# Strategic-merge list keys, by field name (the subset of Kubernetes' patchMergeKey we need).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "volumeClaimTemplates": None,  # replaced
}


class UnsupportedKustomization(ValueError):
    """The kustomization uses a feature this renderer does not implement."""


# --------------------------------------------------------------------------------------- loading


def _read_yaml_docs(path: Path) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d or "apiVersion" not in d:
            raise ValueError(f"{path}: every document must be a Kubernetes object with apiVersion and kind")
    return docs


def _kustomization_file(directory: Path) -> Path:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(f"no kustomization file in {directory}")


def group_version(obj: dict) -> tuple[str, str]:
    api = obj.get("apiVersion", "")
    return tuple(api.split("/", 1)) if "/" in api else ("", api)  # type: ignore[return-value]


def is_builtin(obj: dict) -> bool:
    return group_version(obj)[0] in BUILTIN_GROUPS


def resource_id(obj: dict) -> tuple[str, str, str, str]:
    meta = obj.get("metadata", {})
    return (group_version(obj)[0], obj["kind"], meta.get("namespace", ""), meta["name"])


# -------------------------------------------------------------------------------- strategic merge


def strategic_merge(base: Any, patch: Any, field: str | None = None, builtin: bool = True) -> Any:
    """Merge ``patch`` into a copy of ``base`` (strategic merge for built-in kinds, else RFC 7386)."""
    if isinstance(patch, dict) and isinstance(base, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if key.startswith("$"):
                continue
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = strategic_merge(out[key], value, key, builtin)
            else:
                out[key] = _strip_directives(value)
        return out
    if isinstance(patch, list) and isinstance(base, list) and builtin:
        key = MERGE_KEYS.get(field or "")
        if key is None and field == "ports" and all(isinstance(p, dict) for p in base + patch):
            key = "containerPort" if any("containerPort" in p for p in base + patch) else "port"
        if key is None:
            return _strip_directives(patch)
        # kustomize's order: the patch's items (merged into their base items) in the patch's order,
        # then the base items the patch does not name, in the base's order.
        rest = copy.deepcopy(base)
        head = []
        for item in patch:
            if not isinstance(item, dict) or key not in item:
                raise UnsupportedKustomization(f"list item of {field!r} without merge key {key!r}: {item}")
            idx = next((i for i, b in enumerate(rest) if isinstance(b, dict) and b.get(key) == item[key]), None)
            old = rest.pop(idx) if idx is not None else None
            if item.get("$patch") == "delete":
                continue
            head.append(_strip_directives(item) if old is None else strategic_merge(old, item, None, builtin))
        return head + rest
    return _strip_directives(patch)


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$patch")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return copy.deepcopy(value)


# ------------------------------------------------------------------------------------- JSON 6902


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"JSON pointer must start with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for p in parts[:-1]:
        if isinstance(node, list):
            node = node[int(p)]
        elif isinstance(node, dict) and p in node:
            node = node[p]
        else:
            raise KeyError(f"JSON6902 path {path!r}: {p!r} not found")
    return node, parts[-1]


def _get(doc: Any, path: str) -> Any:
    node = doc
    for p in _pointer(path):
        node = node[int(p)] if isinstance(node, list) else node[p]
    return node


def json6902(doc: dict, ops: list[dict]) -> dict:
    """Apply RFC 6902 operations (add, remove, replace, move, copy, test) to a copy of ``doc``."""
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, path = op["op"], op["path"]
        if kind in ("move", "copy"):
            value = copy.deepcopy(_get(doc, op["from"]))
            if kind == "move":
                doc = json6902(doc, [{"op": "remove", "path": op["from"]}])
            kind, op = "add", {"op": "add", "path": path, "value": value}
        if kind == "test":
            if _get(doc, path) != op["value"]:
                raise AssertionError(f"JSON6902 test failed at {path!r}")
            continue
        parent, last = _container(doc, _pointer(path), path)
        if kind == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif kind == "replace":
            if isinstance(parent, list):
                parent[int(last)] = copy.deepcopy(op["value"])
            elif last in parent:
                parent[last] = copy.deepcopy(op["value"])
            else:
                raise KeyError(f"JSON6902 replace: {path!r} does not exist")
        elif kind == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            elif last in parent:
                del parent[last]
            else:
                raise KeyError(f"JSON6902 remove: {path!r} does not exist")
        else:
            raise UnsupportedKustomization(f"JSON6902 op {kind!r}")
    return doc


# ------------------------------------------------------------------------------------ generators


def _hash_suffix(obj: dict) -> str:
    """kustomize's content hash (api/hasher): sha256 of the sorted JSON, first 10 hex, re-lettered.

    As kustomize v5 computes it, the "name" it hashes is always empty (its lookup of the path
    "metadata/name" finds no field of that name), and a missing data map hashes as "".
    """
    if obj["kind"] == "ConfigMap":
        enc = {"kind": "ConfigMap", "name": "", "data": obj.get("data", "")}
        if obj.get("binaryData"):
            enc["binaryData"] = obj["binaryData"]
    else:
        enc = {"kind": "Secret", "type": obj.get("type", "Opaque"), "name": "", "data": obj.get("data", "")}
    raw = json.dumps(enc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    raw = raw.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    hexed = hashlib.sha256(raw.encode()).hexdigest()[:10]
    return hexed.translate(str.maketrans({"0": "g", "1": "h", "3": "k", "a": "m", "e": "t"}))


def _parse_env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}: line without '=': {line!r}")
        out[key.strip()] = value
    return out


def _generate(spec: dict, kind: str, root: Path, defaults: dict) -> tuple[dict, str, bool]:
    data: dict[str, str] = {}
    for lit in spec.get("literals", []):
        key, sep, value = lit.partition("=")
        if not sep:
            raise ValueError(f"generator {spec['name']}: literal without '=': {lit!r}")
        data[key] = value
    for f in spec.get("files", []):
        key, sep, rel = f.partition("=")
        if not sep:
            key, rel = Path(f).name, f
        data[key] = (root / rel).read_text()
    for env in spec.get("envs", []):
        data.update(_parse_env_file(root / env))
    options = {**defaults, **spec.get("options", {})}
    meta: dict[str, Any] = {"name": spec["name"]}
    if spec.get("namespace"):
        meta["namespace"] = spec["namespace"]
    if options.get("labels"):
        meta["labels"] = dict(options["labels"])
    if options.get("annotations"):
        meta["annotations"] = dict(options["annotations"])
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": meta}
    if kind == "Secret":
        obj["type"] = spec.get("type", "Opaque")
        obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    else:
        obj["data"] = data
    return obj, spec.get("behavior", "create"), not options.get("disableNameSuffixHash", False)


# -------------------------------------------------------------------------------------- renderer


def _matches(obj: dict, target: dict) -> bool:
    group, version = group_version(obj)
    meta = obj.get("metadata", {})
    if "kind" in target and target["kind"] != obj["kind"]:
        return False
    if "group" in target and target["group"] != group:
        return False
    if "version" in target and target["version"] != version:
        return False
    if "name" in target and not re.fullmatch(target["name"], meta.get("name", "")):
        return False
    if "namespace" in target and target["namespace"] != meta.get("namespace", ""):
        return False
    if "labelSelector" in target:
        labels = meta.get("labels", {})
        for term in target["labelSelector"].split(","):
            k, _, v = term.partition("=")
            if labels.get(k.strip()) != v.strip():
                return False
    if "annotationSelector" in target:
        raise UnsupportedKustomization("patch target annotationSelector")
    return True


def _apply_patch(resources: list[dict], entry: dict, root: Path) -> list[dict]:
    text = entry["patch"] if "patch" in entry else (root / entry["path"]).read_text()
    body = yaml.safe_load(text)
    target = entry.get("target")
    if isinstance(body, list):  # JSON6902
        if not target:
            raise ValueError("a JSON6902 patch needs a target")
        hits = [i for i, r in enumerate(resources) if _matches(r, target)]
        if not hits:
            raise ValueError(f"patch {entry.get('path', '<inline>')}: no resource matches {target}")
        for i in hits:
            resources[i] = json6902(resources[i], body)
        return resources
    if not isinstance(body, dict):
        raise ValueError(f"patch {entry.get('path', '<inline>')}: not a mapping or an operation list")
    if target is None:
        group, version = group_version(body)
        target = {"kind": body["kind"], "name": re.escape(body["metadata"]["name"])}
        if group:
            target["group"] = group
    hits = [i for i, r in enumerate(resources) if _matches(r, target)]
    if not hits:
        raise ValueError(f"patch {entry.get('path', '<inline>')}: no resource matches {target}")
    for i in hits:
        r = resources[i]
        patch = copy.deepcopy(body)
        # The patch's identifying fields never rename the target.
        patch["metadata"] = {k: v for k, v in patch.get("metadata", {}).items() if k not in ("name", "namespace")}
        patch.pop("apiVersion", None)
        patch.pop("kind", None)
        resources[i] = strategic_merge(r, patch, None, builtin=is_builtin(r))
    return resources


def _set_path_labels(obj: dict, path: tuple[str, ...], labels: dict, field: str = "labels") -> None:
    node = obj
    for p in path:
        node = node.setdefault(p, {})
    node.setdefault("metadata", {}).setdefault(field, {}).update(labels)


def _template_paths(obj: dict) -> list[tuple[str, ...]]:
    """Where a built-in workload carries object metadata besides its own: its pod template (and a
    CronJob's job template), as kustomize's label / annotation field specs name them."""
    kind = obj["kind"]
    if kind not in WORKLOAD_TEMPLATE_PATHS or not is_builtin(obj):
        return []
    return [("spec", "jobTemplate")] * (kind == "CronJob") + [WORKLOAD_TEMPLATE_PATHS[kind]]


def _apply_labels(resources: list[dict], labels: dict, selectors: bool, templates: bool) -> None:
    for r in resources:
        r.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
        kind = r["kind"]
        if templates or selectors:
            for path in _template_paths(r):
                _set_path_labels(r, path, labels)
        if selectors and is_builtin(r):
            if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
                r.setdefault("spec", {}).setdefault("selector", {}).setdefault("matchLabels", {}).update(labels)
            elif kind == "Service":
                r.setdefault("spec", {}).setdefault("selector", {}).update(labels)


def _split_image(image: str) -> tuple[str, str, str]:
    name, digest = (image.split("@", 1) + [""])[:2]
    tag = ""
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    return name, tag, digest


def _apply_images(node: Any, images: list[dict]) -> None:
    """Update every container image in any ``containers`` / ``initContainers`` list (any kind)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers", "ephemeralContainers") and isinstance(value, list):
                for c in value:
                    if isinstance(c, dict) and isinstance(c.get("image"), str):
                        c["image"] = _new_image(c["image"], images)
            _apply_images(value, images)
    elif isinstance(node, list):
        for v in node:
            _apply_images(v, images)


def _apply_image_at(node: Any, parts: list[str], images: list[dict]) -> None:
    """The images transformer at one field spec path (`spec/autoscalerOptions/image`); lists are walked."""
    if isinstance(node, list):
        for v in node:
            _apply_image_at(v, parts, images)
    elif isinstance(node, dict) and parts:
        if len(parts) == 1:
            if isinstance(node.get(parts[0]), str):
                node[parts[0]] = _new_image(node[parts[0]], images)
        elif parts[0] in node:
            _apply_image_at(node[parts[0]], parts[1:], images)


def _new_image(image: str, images: list[dict]) -> str:
    name, tag, digest = _split_image(image)
    for rule in images:
        if rule["name"] != name:
            continue
        new_name = rule.get("newName", name)
        if rule.get("digest"):
            return f"{new_name}@{rule['digest']}"
        new_tag = rule.get("newTag", tag)
        out = new_name + (f":{new_tag}" if new_tag else "")
        return out + (f"@{digest}" if digest and "newTag" not in rule else "")
    return image


def _rename_refs(node: Any, kind: str, renames: dict[str, str]) -> None:
    """Rename ConfigMap/Secret references in built-in pod specs after hash suffixing."""
    ref_keys = {
        "ConfigMap": ("configMapRef", "configMapKeyRef", "configMap"),
        "Secret": ("secretRef", "secretKeyRef", "secret"),
    }[kind]
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ref_keys and isinstance(value, dict):
                field = "secretName" if (kind == "Secret" and key == "secret") else "name"
                if value.get(field) in renames:
                    value[field] = renames[value[field]]
            _rename_refs(value, kind, renames)
    elif isinstance(node, list):
        for v in node:
            _rename_refs(v, kind, renames)


def _render(root: Path, accumulated: list[dict] | None = None, image_specs: list[dict] | None = None) -> list[dict]:
    """Render the kustomization in ROOT; ACCUMULATED: what the including kustomization has so far
    (a Component works on it; a plain Kustomization starts empty); IMAGE_SPECS: the images field specs
    of `configurations` met so far (shared with the including kustomizations, extended here)."""
    kfile = _kustomization_file(root)
    k = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(k) - SUPPORTED_KEYS
    if unknown:
        raise UnsupportedKustomization(f"{kfile}: unsupported fields {sorted(unknown)}")
    image_specs = [] if image_specs is None else image_specs
    for entry in k.get("configurations", []):
        config = yaml.safe_load((root / entry).read_text()) or {}
        if set(config) - {"images"}:
            raise UnsupportedKustomization(f"{root / entry}: only images field specs are supported")
        image_specs.extend(config.get("images", []))
    is_component = k.get("kind") == "Component"
    if is_component != (accumulated is not None):
        raise ValueError(f"{kfile}: a Component is listed under components, a Kustomization under resources")

    resources: list[dict] = list(accumulated or [])
    for entry in k.get("resources", []):
        path = root / entry
        resources.extend(_render(path, None, image_specs) if path.is_dir() else _read_yaml_docs(path))
    seen = set()
    for r in resources:
        rid = resource_id(r)
        if rid in seen:
            raise ValueError(f"{kfile}: duplicate resource {rid}")
        seen.add(rid)
    for entry in k.get("components", []):
        resources = _render(root / entry, resources, image_specs)

    # Generators (merge/replace act on generated objects inherited from resources).
    defaults = k.get("generatorOptions", {})
    for gen_key, kind in (("configMapGenerator", "ConfigMap"), ("secretGenerator", "Secret")):
        for spec in k.get(gen_key, []):
            obj, behavior, hashed = _generate(spec, kind, root, defaults)
            idx = next(
                (i for i, r in enumerate(resources) if r["kind"] == kind and r["metadata"]["name"] == spec["name"]),
                None,
            )
            if behavior == "create":
                if idx is not None:
                    raise ValueError(f"{kfile}: {kind} {spec['name']} already exists (use behavior: merge)")
            elif behavior in ("merge", "replace"):
                if idx is None:
                    raise ValueError(f"{kfile}: {kind} {spec['name']} to {behavior} does not exist")
                old = resources.pop(idx)
                if behavior == "merge":
                    obj["data"] = {**old.get("data", {}), **obj["data"]}
                    for m in ("labels", "annotations"):
                        merged = {**old["metadata"].get(m, {}), **obj["metadata"].get(m, {})}
                        if merged:
                            obj["metadata"][m] = merged
            else:
                raise UnsupportedKustomization(f"generator behavior {behavior!r}")
            obj["metadata"].setdefault("annotations", {})["internal.calib-sweeps/generated-name"] = spec["name"]
            obj["metadata"]["annotations"]["internal.calib-sweeps/hash"] = "true" if hashed else "false"
            resources.append(obj)

    for entry in k.get("patches", []):
        resources = _apply_patch(resources, entry, root)

    if k.get("namespace"):
        ns = k["namespace"]
        for r in resources:
            if r["kind"] == "Namespace":
                r["metadata"]["name"] = ns
            elif r["kind"] not in CLUSTER_SCOPED:
                r["metadata"]["namespace"] = ns

    for spec in k.get("labels", []):
        _apply_labels(
            resources, spec.get("pairs", {}), spec.get("includeSelectors", False), spec.get("includeTemplates", False)
        )
    if k.get("commonLabels"):
        _apply_labels(resources, k["commonLabels"], True, True)
    if k.get("commonAnnotations"):
        for r in resources:
            r.setdefault("metadata", {}).setdefault("annotations", {}).update(k["commonAnnotations"])
            for path in _template_paths(r):
                _set_path_labels(r, path, k["commonAnnotations"], "annotations")

    if k.get("images"):
        for r in resources:
            _apply_images(r, k["images"])
            for spec in image_specs:
                if spec.get("kind", r["kind"]) == r["kind"]:
                    _apply_image_at(r, spec["path"].split("/"), k["images"])

    return resources


def _finish(resources: list[dict]) -> list[dict]:
    renames: dict[str, dict[str, str]] = {"ConfigMap": {}, "Secret": {}}
    for r in resources:
        ann = r.get("metadata", {}).get("annotations", {})
        if "internal.calib-sweeps/generated-name" not in ann:
            continue
        hashed = ann.pop("internal.calib-sweeps/hash") == "true"
        ann.pop("internal.calib-sweeps/generated-name")
        if not ann:
            r["metadata"].pop("annotations")
        if hashed:
            old = r["metadata"]["name"]
            r["metadata"]["name"] = f"{old}-{_hash_suffix(r)}"
            renames[r["kind"]][old] = r["metadata"]["name"]
    for r in resources:
        if is_builtin(r):
            for kind, table in renames.items():
                if table:
                    _rename_refs(r, kind, table)
    return resources


# kustomize's legacy output order (api/resid/gvk.go): these kinds first, in this order, these last,
# every other kind in between; ties by "group_version_kind" ("~G" / "~V" when empty), namespace, name.
_ORDER_FIRST = (
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
)
_ORDER_LAST = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
_TYPE_ORDER = {
    **{k: i - len(_ORDER_FIRST) for i, k in enumerate(_ORDER_FIRST)},
    **{k: i + 1 for i, k in enumerate(_ORDER_LAST)},
}


def _legacy_order(obj: dict) -> tuple[int, str, str, str]:
    group, version = group_version(obj)
    gvk = "_".join((group or "~G", version or "~V", obj["kind"]))
    meta = obj.get("metadata", {})
    return _TYPE_ORDER.get(obj["kind"], 0), gvk, meta.get("namespace", ""), meta.get("name", "")


@functools.cache
def _build_cached(root: str) -> str:
    return json.dumps(sorted(_finish(_render(Path(root))), key=_legacy_order))


def build(directory: str | Path) -> list[dict]:
    """Render a kustomization with the Python renderer, as `kustomize build DIR` would; returns fresh
    copies (cached). The tests call :func:`render`, which prefers the real kubectl."""
    return json.loads(_build_cached(str(Path(directory).resolve())))


# ------------------------------------------------------------------------- kubectl kustomize

KUSTOMIZE_ENV = "CALIB_KUSTOMIZE"  # unset: kubectl if usable, else Python; "kubectl" / "python": that one
MIN_KUSTOMIZE = (5, 0)  # deploy/ uses `labels` with includeTemplates and `patches` with targets


class KustomizeError(RuntimeError):
    """`kubectl kustomize` failed (its message included), or kubectl was required and is unusable."""


@functools.cache
def find_kubectl() -> tuple[str | None, str]:
    """(path of a kubectl whose embedded kustomize is >= v5, or None; a sentence saying why)."""
    exe = shutil.which("kubectl")
    if exe is None:
        return None, "kubectl not found on PATH"
    try:
        proc = subprocess.run([exe, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=60)
        version = str(json.loads(proc.stdout).get("kustomizeVersion", ""))
    except (OSError, subprocess.SubprocessError, ValueError, AttributeError):
        version = ""
    m = re.match(r"v?(\d+)\.(\d+)", version)
    if not m or (int(m[1]), int(m[2])) < MIN_KUSTOMIZE:
        return None, f"{exe} embeds kustomize {version or '(version unknown)'}, older than v5.0"
    return exe, f"kubectl kustomize ({exe}, kustomize {version})"


def renderer() -> str:
    """Which renderer :func:`render` uses, in words (for the pytest header and messages)."""
    choice = os.environ.get(KUSTOMIZE_ENV, "").strip().lower()
    if choice == "python":
        return f"tests/deploy_render.py (Python fallback; {KUSTOMIZE_ENV}=python)"
    exe, why = find_kubectl()
    if exe is not None:
        return why
    if choice == "kubectl":
        raise KustomizeError(f"{KUSTOMIZE_ENV}=kubectl but {why}")
    return f"tests/deploy_render.py (Python fallback: {why})"


@functools.cache
def _kubectl_cached(exe: str, root: str) -> str:
    proc = subprocess.run([exe, "kustomize", root], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise KustomizeError(f"kubectl kustomize {root} failed: {proc.stderr.strip()}")
    return json.dumps([d for d in yaml.safe_load_all(proc.stdout) if d is not None])


def kubectl_build(directory: str | Path) -> list[dict]:
    """`kubectl kustomize DIR`, its multi-document YAML parsed; fresh copies (cached)."""
    exe, why = find_kubectl()
    if exe is None:
        raise KustomizeError(why)
    return json.loads(_kubectl_cached(exe, str(Path(directory).resolve())))


def render(directory: str | Path) -> list[dict]:
    """Render a kustomization directory for the tests: the real `kubectl kustomize` when available
    (kustomize >= v5), else the Python renderer (:func:`build`). See :data:`KUSTOMIZE_ENV`."""
    if renderer().startswith("kubectl"):
        return kubectl_build(directory)
    return build(directory)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python tests/deploy_render.py KUSTOMIZATION_DIR", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump_all(build(args[0]), sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ------------------------------------------------------------------------- helpers for the tests

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY = REPO_ROOT / "deploy"


def overlay_dirs() -> list[Path]:
    """Every overlay under deploy/overlays that has a kustomization."""
    return sorted(p.parent for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))


def pod_specs(obj: dict) -> list[tuple[str, dict]]:
    """(where, PodSpec) for every pod template an object carries, custom Ray resources included."""
    kind, name = obj["kind"], obj.get("metadata", {}).get("name", "?")
    spec = obj.get("spec", {})
    out: list[tuple[str, dict]] = []
    if kind in WORKLOAD_TEMPLATE_PATHS and is_builtin(obj):
        node: Any = obj
        for p in WORKLOAD_TEMPLATE_PATHS[kind]:
            node = node[p]
        out.append((f"{kind}/{name}", node["spec"]))
    elif kind == "Pod":
        out.append((f"Pod/{name}", spec))
    elif kind in ("RayJob", "RayCluster"):
        cluster = spec.get("rayClusterSpec", {}) if kind == "RayJob" else spec
        if kind == "RayJob" and "submitterPodTemplate" in spec:
            out.append((f"{kind}/{name}/submitter", spec["submitterPodTemplate"]["spec"]))
        if "headGroupSpec" in cluster:
            out.append((f"{kind}/{name}/head", cluster["headGroupSpec"]["template"]["spec"]))
        for group in cluster.get("workerGroupSpecs", []):
            out.append((f"{kind}/{name}/worker:{group['groupName']}", group["template"]["spec"]))
    return out


def ray_cluster_spec(obj: dict) -> dict | None:
    """The RayClusterSpec of a RayJob or RayCluster (None for other kinds)."""
    if obj["kind"] == "RayJob":
        return obj["spec"].get("rayClusterSpec")
    if obj["kind"] == "RayCluster":
        return obj["spec"]
    return None


def namespace_of(resources: list[dict]) -> str:
    """The one namespace an overlay's namespaced objects are rendered into."""
    namespaces = {r["metadata"].get("namespace") for r in resources if r["kind"] not in CLUSTER_SCOPED}
    namespaces.discard(None)
    if len(namespaces) != 1:
        raise ValueError(f"expected one namespace, got {sorted(namespaces)}")
    return namespaces.pop()


def persistent_dir(overlay: Path) -> Path:
    """The overlay's persistent/ kustomization (Namespace, dataset cache), applied once."""
    return overlay / "persistent"
