"""deploy/: every overlay renders, validates (strict Kubernetes schemas, our KubeRay schema), and
every credential comes from a Secret whose template exists and holds placeholders only."""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import os
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils
from referencing import Registry, Resource

from tests import deploy_render as dr

REPO, DEPLOY = dr.REPO_ROOT, dr.DEPLOY
OVERLAYS = dr.overlay_dirs()
OVERLAY_IDS = [p.name for p in OVERLAYS]
# Newest Kubernetes minor kubernetes-validate ships schemas for, and an older one still common on
# managed clusters: the manifests must be valid on both.
K8S_LATEST = kv_utils.latest_version()
K8S_VERSIONS = sorted({K8S_LATEST, "1.33"}, key=lambda v: tuple(int(x) for x in v.split(".")[:2]))
RAY_KINDS = ("RayJob", "RayCluster")
SCHEMA_PATH = DEPLOY / "schemas" / "kuberay-ray.io-v1.schema.json"


def test_expected_overlays_exist():
    assert {"dev", "gpu-cluster"} <= set(OVERLAY_IDS)
    assert (DEPLOY / "base" / "kustomization.yaml").is_file()


# ------------------------------------------------------------------- built-in kinds, strict mode


def test_kubernetes_validate_ships_a_current_version():
    major, minor = (int(x) for x in K8S_LATEST.split(".")[:2])
    assert (major, minor) >= (1, 33), f"kubernetes-validate only knows Kubernetes {K8S_LATEST}"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_builtin_resources_validate_strictly(overlay, version):
    resources = dr.render(overlay)
    builtin = [r for r in resources if dr.is_builtin(r)]
    assert builtin, "overlay rendered no built-in resources"
    for r in builtin:
        where = f"{overlay.name}: {r['kind']}/{r['metadata']['name']}"
        try:
            kubernetes_validate.validate(r, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{where} (Kubernetes {e.version}): {e.message} at {list(e.absolute_path)}")
        except kubernetes_validate.SchemaNotFoundError as e:
            pytest.fail(f"{where}: {e.message}")


def test_only_ray_custom_resources_are_used():
    for overlay in OVERLAYS:
        custom = {(r["apiVersion"], r["kind"]) for r in dr.render(overlay) if not dr.is_builtin(r)}
        # and the Prometheus Operator's, where monitoring is on (gpu-cluster: components/monitoring)
        monitoring = {("monitoring.coreos.com/v1", k) for k in ("PodMonitor", "ServiceMonitor", "PrometheusRule")}
        # and the Gateway API's way in (gpu-cluster; validated against its CRDs in test_rollout_portability.py)
        gateway = {("gateway.networking.k8s.io/v1", k) for k in ("HTTPRoute", "BackendTLSPolicy")}
        assert custom <= {("ray.io/v1", "RayJob"), ("ray.io/v1", "RayCluster"), *monitoring, *gateway}, custom


def test_strict_mode_rejects_a_misspelled_builtin_field():
    dep = next(r for r in dr.render(OVERLAYS[0]) if r["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_LATEST, strict=True)


# --------------------------------------------------------------------- KubeRay custom resources


def _k8s_definitions() -> dict:
    return kv_utils.schema_contents(f"kubernetes-json-schema/v{K8S_LATEST}-local-strict/_definitions.json", K8S_LATEST)


_VALIDATORS: dict[str, jsonschema.protocols.Validator] = {}


def ray_validator(kind: str):
    if kind not in _VALIDATORS:
        ours = json.loads(SCHEMA_PATH.read_text())
        registry = Registry().with_resources(
            [
                (ours["$id"], Resource.from_contents(ours)),
                ("https://kubernetes.io/api/_definitions.json", Resource.from_contents(_k8s_definitions())),
            ]
        )
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": f"{ours['$id']}#/$defs/{kind}"}
        _VALIDATORS[kind] = jsonschema.Draft202012Validator(schema, registry=registry)
    return _VALIDATORS[kind]


def _ray_errors(obj: dict) -> list[str]:
    errors = sorted(ray_validator(obj["kind"]).iter_errors(obj), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


# The real KubeRay CRDs (v1.7.0, ray-operator/config/crd/bases of ray-project/kuberay at the tag's
# commit below), vendored gzipped with their license in KUBERAY_CRD_DIR (deploy/schemas/
# kuberay-v1.7.0/, README.md there; an uncompressed copy is read first). Every Ray object is also
# validated against them, strictly (unknown fields rejected, as `kubectl apply` does with
# server-side field validation), besides the hand-written schema above.
KUBERAY_VERSION, KUBERAY_COMMIT = "v1.7.0", "59d663aeec13760646da3db9c1cf8cfe883e30b7"
KUBERAY_CRD_DIR = Path(os.environ.get("KUBERAY_CRD_DIR", DEPLOY / "schemas" / f"kuberay-{KUBERAY_VERSION}"))
CRD_FILES = {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}


def _strict(node):
    """An OpenAPI v3 CRD schema as a JSON schema that rejects unknown fields."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        node.get("type") == "object"
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


CRD_SHA256 = {
    "RayJob": "01a5cf3b17c1769fda44af7e82debcd98722f0c27b9ab84d084681c6649121f5",
    "RayCluster": "c44704442eef0c6721ad40c1d66782c8bd3fdab9d3344306a5820910a679baa1",
}


@functools.cache
def _crd_text(kind: str) -> str | None:
    """The CRD file's text (uncompressed copy, else the vendored .gz), None where neither exists."""
    import gzip

    path = KUBERAY_CRD_DIR / CRD_FILES[kind]
    if path.is_file():
        return path.read_text()
    packed = path.with_name(path.name + ".gz")
    return gzip.decompress(packed.read_bytes()).decode() if packed.is_file() else None


@functools.cache
def _crd_schema(kind: str) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(_crd_text(kind) or "", Loader=loader)
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]


@functools.cache
def real_crd_validator(kind: str):
    if _crd_text(kind) is None:
        return None
    schema = _strict(_crd_schema(kind))
    return jsonschema.Draft7Validator(schema)


def real_crd_errors(obj: dict) -> list[str] | None:
    """Errors against the real KubeRay CRD, or None where the CRD files are not present."""
    validator = real_crd_validator(obj["kind"])
    if validator is None:
        return None
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


def kuberay_errors(obj: dict) -> list[str]:
    """Schema errors of a RayJob / RayCluster: the real CRD where present, and always ours."""
    return (real_crd_errors(obj) or []) + _ray_errors(obj)


def _need_real_crds():
    if KUBERAY_CRD_DIR != DEPLOY / "schemas" / f"kuberay-{KUBERAY_VERSION}" and (
        real_crd_validator("RayJob") is None or real_crd_validator("RayCluster") is None
    ):
        pytest.skip(f"KubeRay CRDs not in KUBERAY_CRD_DIR={KUBERAY_CRD_DIR}")


def test_vendored_kuberay_crds_are_the_release_files():
    import hashlib

    for kind, digest in CRD_SHA256.items():
        text = _crd_text(kind)
        assert text is not None, f"{CRD_FILES[kind]}(.gz) missing from {KUBERAY_CRD_DIR}"
        assert hashlib.sha256(text.encode()).hexdigest() == digest, kind


def test_our_kuberay_schema_is_a_valid_schema_with_closed_objects():
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    for name, d in schema["$defs"].items():
        if d.get("type") == "object" and "properties" in d:
            assert d.get("additionalProperties") is False, f"$defs/{name} must reject unknown fields"


def _ray_objects():
    out = []
    for overlay in [DEPLOY / "base", *OVERLAYS]:
        for r in dr.render(overlay):
            if r["kind"] in RAY_KINDS:
                out.append(pytest.param(r, id=f"{overlay.name}-{r['kind']}-{r['metadata']['name']}"))
    return out


@pytest.mark.parametrize("obj", _ray_objects())
def test_ray_resources_validate_against_our_kuberay_schema(obj):
    assert obj["apiVersion"] == "ray.io/v1"
    assert _ray_errors(obj) == []


@pytest.mark.parametrize("obj", _ray_objects())
def test_ray_resources_validate_against_the_real_kuberay_crd(obj):
    _need_real_crds()
    assert real_crd_errors(obj) == []


@pytest.mark.parametrize(
    "path,new_key",
    [
        (["spec", "rayClusterSpec", "authOptions", "secretName"], "secretname"),
        (["spec", "rayClusterSpec", "workerGroupSpecs", 0, "maxReplicas"], "maxReplica"),
        (["spec", "submitterPodTemplate", "spec", "containers", 0, "securityContext"], "securitycontext"),
    ],
    ids=["authOptions", "workerGroup", "podTemplate"],
)
def test_real_crd_rejects_misspelled_fields(path, new_key):
    _need_real_crds()
    job = next(r for r in dr.render(OVERLAYS[0]) if r["kind"] == "RayJob")
    assert real_crd_errors(_misspell(job, path, new_key))


def test_our_schema_allows_nothing_the_real_crd_refuses():
    """Every field our hand-written schema knows exists in the real CRD at the same place."""
    _need_real_crds()
    ours = json.loads(SCHEMA_PATH.read_text())
    missing: list[str] = []

    def walk(node, real_node, path):
        node = _resolve(ours, node)
        for key, sub in node.get("properties", {}).items():
            real_sub = real_node.get("properties", {}).get(key)
            if real_sub is None:
                missing.append("/".join(path + [key]))
            elif not (isinstance(sub, dict) and "_definitions" in sub.get("$ref", "")):  # not a built-in type
                walk(sub, real_sub, path + [key])
        items = node.get("items")
        if isinstance(items, dict) and "items" in real_node:
            walk(items, real_node["items"], path + ["[]"])

    for kind in RAY_KINDS:
        walk(ours["$defs"][kind], _crd_schema(kind), [kind])
        assert not missing, f"fields our schema allows that KubeRay {KUBERAY_VERSION} does not know: {missing}"


def _resolve(root: dict, node: dict) -> dict:
    while isinstance(node, dict) and "$ref" in node and node["$ref"].startswith("#/$defs/"):
        node = root["$defs"][node["$ref"].split("/")[-1]]
    return node


def _misspell(obj: dict, path: list, new_key: str) -> dict:
    bad = copy.deepcopy(obj)
    node = bad
    for p in path[:-1]:
        node = node[p]
    node[new_key] = node.pop(path[-1])
    return bad


MISSPELLINGS = [
    (["spec", "shutdownAfterJobFinishes"], "shutdownAfterJobFinish"),
    (["spec", "rayClusterSpec", "enableInTreeAutoscaling"], "enableIntreeAutoscaling"),
    (["spec", "rayClusterSpec", "workerGroupSpecs", 0, "maxReplicas"], "maxReplica"),
    (["spec", "rayClusterSpec", "headGroupSpec", "rayStartParams"], "rayStartParameters"),
    (["spec", "rayClusterSpec", "authOptions", "secretName"], "secretname"),
    # Inside a pod template: the strict Kubernetes definitions take over.
    (["spec", "rayClusterSpec", "workerGroupSpecs", 0, "template", "spec", "tolerations"], "toleration"),
    (["spec", "submitterPodTemplate", "spec", "containers", 0, "securityContext"], "securitycontext"),
]


@pytest.mark.parametrize("path,new_key", MISSPELLINGS, ids=[m[1] for m in MISSPELLINGS])
def test_kuberay_schema_rejects_misspelled_fields(path, new_key):
    job = next(r for r in dr.render(OVERLAYS[0]) if r["kind"] == "RayJob")
    assert _ray_errors(job) == []
    errors = _ray_errors(_misspell(job, path, new_key))
    assert errors, f"misspelled {new_key!r} was accepted"


def test_kuberay_schema_rejects_bad_values():
    job = next(r for r in dr.render(OVERLAYS[0]) if r["kind"] == "RayJob")
    cases = [
        (
            "rayStartParams value must be a string",
            ["spec", "rayClusterSpec", "headGroupSpec", "rayStartParams", "num-gpus"],
            0,
        ),
        ("submissionMode enum", ["spec", "submissionMode"], "K8sJob"),
        ("rayVersion x.y.z", ["spec", "rayClusterSpec", "rayVersion"], "2.60"),
        ("negative backoffLimit", ["spec", "backoffLimit"], -1),
    ]
    for what, path, value in cases:
        bad = copy.deepcopy(job)
        node = bad
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
        assert _ray_errors(bad), f"accepted: {what}"


@pytest.mark.parametrize("obj", _ray_objects())
def test_worker_group_replica_bounds(obj):
    for group in dr.ray_cluster_spec(obj).get("workerGroupSpecs", []):
        lo, n, hi = group.get("minReplicas", 0), group.get("replicas", 0), group["maxReplicas"]
        assert 0 <= lo <= n <= hi and hi >= 1, (group["groupName"], lo, n, hi)


# ----------------------------------------------------------------------------------- secrets

SECRET_TEMPLATE = "secrets.example.yaml"


def _secret_templates(overlay: Path) -> dict[str, dict]:
    path = overlay / SECRET_TEMPLATE
    assert path.is_file(), f"{overlay.name}: no {SECRET_TEMPLATE}"
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert all(d["kind"] == "Secret" for d in docs)
    return {d["metadata"]["name"]: d for d in docs}


def secret_refs(resources: list[dict]) -> set[tuple[str, str | None, str]]:
    """(secret, key or None, where) for every Secret a rendered overlay refers to."""
    refs: set[tuple[str, str | None, str]] = set()

    def walk(node, where):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "secretKeyRef":
                    refs.add((value["name"], value["key"], where))
                elif key == "secretRef" and isinstance(value, dict):
                    refs.add((value["name"], None, where))
                elif key == "secret" and isinstance(value, dict) and "secretName" in value:
                    refs.add((value["secretName"], None, where))
                elif key == "imagePullSecrets":
                    refs.update((s["name"], None, where) for s in value)
                elif key == "authOptions" and value.get("secretName"):
                    refs.add((value["secretName"], "auth_token", where))
                walk(value, where)
        elif isinstance(node, list):
            for v in node:
                walk(v, where)

    for r in resources:
        where = f"{r['kind']}/{r['metadata']['name']}"
        if r["kind"] == "Ingress":
            # TLS certificates issued by cert-manager are created by it, not by us.
            if not any(a.startswith("cert-manager.io/") for a in r["metadata"].get("annotations", {})):
                refs.update((t["secretName"], None, where) for t in r["spec"].get("tls", []))
            continue
        walk(r, where)
    return refs


def _tls_secrets() -> dict[str, dict]:
    """The TLS Secrets deploy/dev_tls.py prints (cert-manager's key names; deploy/components/cert-manager issues
    mlflow-tls instead on a cluster that has it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dev_tls", dr.DEPLOY / "dev_tls.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(module.manifest(module.issue("calib-sweeps")))}


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_every_referenced_secret_has_a_template(overlay):
    resources = dr.render(overlay)
    templates = _secret_templates(overlay)
    tls = _tls_secrets()
    if not any(r["kind"] == "StatefulSet" and r["metadata"]["name"] == "postgres" for r in resources):
        # an external database: its CA (postgres-ca) is the user's, in the credentials template
        tls = {name: d for name, d in tls.items() if not name.startswith("postgres-")}
    assert not set(tls) & set(templates), "a TLS Secret is also in the credentials template"
    refs = secret_refs(resources)
    assert refs, "no Secret references found"
    for name, key, where in sorted(refs, key=str):
        if name in tls:
            assert key is None or key in tls[name]["data"], f"{where} refers to {name}/{key}: not a TLS key"
            continue
        assert name in templates, f"{where} refers to Secret {name!r}, missing in {overlay.name}/{SECRET_TEMPLATE}"
        if key is not None:
            keys = set(templates[name].get("stringData", {})) | set(templates[name].get("data", {}))
            assert key in keys, f"{where} refers to {name}/{key}; the template has {sorted(keys)}"
    unused = set(templates) - {name for name, _, _ in refs}
    assert not unused, f"templates nobody uses: {sorted(unused)}"


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_rendered_overlays_contain_no_secrets(overlay):
    # Secrets are applied from the filled templates, never by `kubectl apply -k` (re-applying the
    # manifests must not reset credentials, and git must never hold them).
    assert not [r for r in dr.render(overlay) if r["kind"] == "Secret"]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_secret_templates_validate_and_hold_placeholders_only(overlay):
    for name, secret in _secret_templates(overlay).items():
        kubernetes_validate.validate(secret, K8S_LATEST, strict=True)
        assert "data" not in secret, f"{name}: use stringData with placeholders in templates"
        for key, value in secret["stringData"].items():
            if key in NON_SECRET_KEYS:
                continue
            assert "CHANGE_ME_" in value, f"{overlay.name}/{name}/{key} is not a placeholder"


def _render_secrets_module():
    spec = importlib.util.spec_from_file_location("render_secrets", DEPLOY / "render_secrets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_render_secrets_fills_placeholders_consistently():
    rs = _render_secrets_module()
    filled = rs.fill((OVERLAYS[OVERLAY_IDS.index("dev")] / SECRET_TEMPLATE).read_text(), {})
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(filled) if d}
    assert "CHANGE_ME" not in "".join(line for line in filled.splitlines() if not line.lstrip().startswith("#"))
    pg = docs["postgres-credentials"]["stringData"]["password"]
    assert len(pg) >= 32
    dsn = docs["mlflow-db"]["stringData"]["backend-store-uri"]
    assert dsn == f"postgresql://mlflow:{pg}@postgres:5432/mlflow?sslmode=verify-full"
    # the sweep logs in as its own user (deploy/base/mlflow/sweep-user-job.yaml), never as the admin
    tracking, admin = docs["mlflow-tracking"]["stringData"], docs["mlflow-auth"]["stringData"]
    assert tracking["username"] != admin["admin-username"] and tracking["password"] != admin["admin-password"]
    assert len(tracking["password"]) >= 32
    assert docs["tune-storage-s3"]["stringData"] == docs["mlflow-artifacts-s3"]["stringData"]
    tune_s3 = docs["tune-storage-s3"]["stringData"]
    assert docs["minio-credentials"]["stringData"]["root-password"] == tune_s3["secret-access-key"]
    assert docs["ray-auth-token"]["stringData"]["auth_token"] != pg
    for d in docs.values():
        kubernetes_validate.validate(d, K8S_LATEST, strict=True)


def test_render_secrets_requires_user_values(tmp_path):
    rs = _render_secrets_module()
    text = (OVERLAYS[OVERLAY_IDS.index("gpu-cluster")] / SECRET_TEMPLATE).read_text()
    with pytest.raises(SystemExit, match="DB_PASSWORD"):
        rs.fill(text, {})
    env = {
        n: f"value-{n.lower()}"
        for n in (
            "DB_USER",
            "DB_PASSWORD",
            "DB_HOST",
            "DB_NAME",
            "MLFLOW_S3_ACCESS_KEY_ID",
            "MLFLOW_S3_SECRET_ACCESS_KEY",
            "TUNE_S3_ACCESS_KEY_ID",
            "TUNE_S3_SECRET_ACCESS_KEY",
            "BACKUP_S3_ACCESS_KEY_ID",
            "BACKUP_S3_SECRET_ACCESS_KEY",
            "OPTUNA_DB_USER",
            "OPTUNA_DB_PASSWORD",
            "OPTUNA_DB_NAME",
        )
    }
    with pytest.raises(SystemExit, match="DB_CA_FILE"):
        rs.fill(text, env)
    with pytest.raises(SystemExit, match=r"cannot read .*DB_CA_FILE="):
        rs.fill(text, {**env, "DB_CA_FILE": str(tmp_path / "missing.pem")})
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    (tmp_path / "ca.pem").write_text(pem)
    env["DB_CA_FILE"] = str(tmp_path / "ca.pem")
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(rs.fill(text, env)) if d}
    # TLS with the server's certificate and name checked against the database's own CA (postgres-ca)
    assert docs["mlflow-db"]["stringData"]["backend-store-uri"] == (
        "postgresql://value-db_user:value-db_password@value-db_host:5432/value-db_name?sslmode=verify-full"
    )
    assert docs["postgres-ca"]["stringData"]["ca.crt"] == pem  # the file, multi-line, read back as it was
    # The Optuna study: its own role and database on the same server.
    assert docs["optuna-storage"]["stringData"]["url"] == (
        "postgresql://value-optuna_db_user:value-optuna_db_password@value-db_host:5432/value-optuna_db_name"
        "?sslmode=verify-full"
    )


def test_filled_secrets_are_ignored_by_git():
    ignored = (DEPLOY / ".gitignore").read_text().split()
    assert "secrets.yaml" in ignored


# ---------------------------------------------------------------------- no plaintext credentials

# Secret keys whose values are identifiers, not credentials.
NON_SECRET_KEYS = {"admin-username", "username"}
SECRET_WORDS = re.compile(r"pass(word|wd)?|secret|token|api[-_]?key|access[-_]?key|private[-_]?key|credential", re.I)
# A value that is clearly not a literal credential: placeholder, reference, variable, template.
SAFE_VALUE = re.compile(r"^(CHANGE_ME_[A-Z0-9_]+|\$\(?\{?[A-Za-z_].*|<[^>]+>|\{\{.*\}\}|\.\.\.|\*+|)$")
# YAML block markers and plain scalars that are not literal values either.
YAML_NON_LITERALS = ("|", ">-", ">", "|-", "{}", "[]", "null", "true", "false")
URI_CREDENTIAL = re.compile(r"[a-z][a-z0-9+.-]*://([^/\s:@'\"]+):([^@\s/'\"]+)@")
KEY_VALUE = re.compile(r"""^\s*-?\s*["']?([A-Za-z0-9_.-]+)["']?\s*[:=]\s*["']?([^\s"'#]+)""")
LONG_RANDOM = re.compile(r"(?<![A-Za-z0-9/+_-])(?:[0-9a-f]{32,}|[A-Za-z0-9+/]{40,}={0,2})(?![A-Za-z0-9/+_-])")
KNOWN_SECRET_SHAPES = [
    re.compile(r"AKIA[0-9A-Z]{16}"),  # AWS access key id
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"gh[pousr]_[A-Za-z0-9]{36,}"),  # GitHub tokens
    re.compile(r"xox[abprs]-[A-Za-z0-9-]{10,}"),  # Slack tokens
]


def _is_reference_key(key: str) -> bool:
    # secretName / secretKeyRef / secretRef / ..._FILE / ..._PATH name where a value lives.
    return bool(re.search(r"(name|ref|file|path|mode)$", key, re.I))


def scan_text(text: str, is_template: bool) -> list[str]:
    """Findings (line number: reason) of credential-looking literals in one file's text."""
    findings = []
    for no, line in enumerate(text.splitlines(), 1):
        for shape in KNOWN_SECRET_SHAPES:
            if shape.search(line):
                findings.append(f"{no}: looks like a real key/token")
        for m in URI_CREDENTIAL.finditer(line):
            pwd = m.group(2)
            if not SAFE_VALUE.match(pwd) or (pwd.startswith("CHANGE_ME") and not is_template):
                findings.append(f"{no}: credential inside a URI")
        m = KEY_VALUE.match(line)
        if m and not line.lstrip().startswith("#"):
            key, value = m.group(1), m.group(2)
            if SECRET_WORDS.search(key) and not _is_reference_key(key) and key not in NON_SECRET_KEYS:
                if value.startswith("CHANGE_ME") and not is_template:
                    findings.append(f"{no}: placeholder outside a *.example* template")
                elif not SAFE_VALUE.match(value) and value not in YAML_NON_LITERALS:
                    findings.append(f"{no}: literal value for {key!r}")
        for m in LONG_RANDOM.finditer(line):
            # Image digests, absolute paths (JSON pointers) and mapping keys (requiredDuringScheduling...) are not
            # secrets.
            key = line[m.end() :].startswith(":")
            # a field path (spec/autoscalerOptions/image): words of letters between slashes, no digits
            path = re.fullmatch(r"[A-Za-z]{2,30}(?:/[A-Za-z]{2,30}){2,}", m.group(0)) is not None
            # a git commit cited in a comment ("... at commit <40 hex>", "# <40 hex> (...)") is a public record
            commit = re.fullmatch(r"[0-9a-f]{40}", m.group(0)) is not None and line.lstrip().startswith("#")
            cited = line[: m.start()].endswith("sha256:") or commit
            if not cited and not m.group(0).startswith("/") and not key and not path:
                findings.append(f"{no}: long random-looking string")
    return findings


def _scanned_files() -> list[Path]:
    files = [REPO / ".dockerignore"]
    for root in (DEPLOY, REPO / "docker"):
        files += [
            p
            for p in root.rglob("*")
            if p.is_file()
            and "__pycache__" not in p.parts
            and not any(d.name.startswith(("kuberay-v", "gateway-api-v")) for d in p.parents)
        ]  # third-party CRDs
    return [p for p in files if p.exists()]


def test_no_plaintext_credentials_in_deploy_or_docker():
    problems = []
    for path in _scanned_files():
        if path.suffix == ".json":
            continue  # the JSON schema: descriptions only
        text = path.read_text()
        problems += [f"{path.relative_to(REPO)}:{f}" for f in scan_text(text, ".example" in path.name)]
    assert not problems, "\n".join(problems)


def test_env_credentials_are_never_literal_values():
    for overlay in [DEPLOY / "base", *OVERLAYS]:
        for r in dr.render(overlay):
            for where, spec in dr.pod_specs(r):
                for c in spec.get("containers", []) + spec.get("initContainers", []):
                    for e in c.get("env", []):
                        if SECRET_WORDS.search(e["name"]) and not e["name"].endswith(("_MODE", "_PATH", "_FILE")):
                            assert "valueFrom" in e and "value" not in e, f"{where}/{c['name']}: {e['name']}"
            cluster = dr.ray_cluster_spec(r)
            for e in (cluster or {}).get("autoscalerOptions", {}).get("env", []):
                if SECRET_WORDS.search(e["name"]) and not e["name"].endswith("_MODE"):
                    assert "valueFrom" in e and "value" not in e, e


@pytest.mark.parametrize(
    "text,template,expected",
    [
        ("password: hunter2hunter2", False, True),
        ("  admin-password: s3cr3tValue", True, True),
        ("- name: X\n  value: postgresql://mlflow:realpass@db:5432/mlflow", False, True),
        ("token = 0123456789abcdef0123456789abcdef01234567", False, True),
        ("aws_access_key_id = AKIAABCDEFGHIJKLMNOP", False, True),
        ("password: CHANGE_ME_RANDOM_X", False, True),  # placeholder outside a template
        ("password: CHANGE_ME_RANDOM_X", True, False),
        ("uri: postgresql://mlflow:CHANGE_ME_DB_PASSWORD@db/mlflow", True, False),
        ("secretName: ray-auth-token", False, False),
        ("RAY_AUTH_TOKEN: $(RAY_AUTH_TOKEN)", False, False),
        ("export RAY_AUTH_TOKEN=$(kubectl get secret ray-auth-token -o jsonpath=...)", False, False),
        ("image: x@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", False, False),
        ("# record at commit 3effc3eac4f65a99767fd721667a1bf157496ba4 (built ...)", False, False),  # a cited commit
        ("token: 3effc3eac4f65a99767fd721667a1bf157496ba4", False, True),  # the same hex as a value is still found
        ("  - path: spec/rayClusterSpec/autoscalerOptions/image", False, False),  # a field path
        ("key: QmFzZTY0L3NlY3JldC92YWx1ZS9oZXJlL2FuZC9tb3Jl", False, True),  # base64 is still found
        ("x = abc/defghijklmnopqrstuvwxyz1234567890/ABCDEFGHIJ", False, True),  # a digit: not a field path
    ],
)
def test_credential_scanner_finds_what_it_should(text, template, expected):
    assert bool(scan_text(text, template)) is expected, scan_text(text, template)
