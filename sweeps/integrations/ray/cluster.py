"""Joining a Ray cluster and checking it can run the sweep (`--cluster`): the service owns the connection.

Reads the cluster's state only; nothing of the sweep is written here.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from calib_core.config import ConfigError
from calib_core.redaction import redact
from sweeps.checks.servers import address_host, is_loopback, probe_tcp, ray_address

if TYPE_CHECKING:
    from sweeps.config import SweepConfig


@contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """Collect what is written to file descriptor 2 (Ray's C++ core logs there) meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    out: list[str] = []
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode(errors="replace"))


def plugin_runtime_env(plugins: list[str]) -> dict[str, Any] | None:
    """Ray's runtime_env that ships the plugin modules (calib_core/plugins.py) not installed in site-packages
    to every node (`py_modules`; the trials import them), or None."""
    from calib_core.plugins import load_plugins

    mods = []
    for name in load_plugins(plugins):
        top = sys.modules.get(name.split(".")[0])
        where = getattr(top, "__file__", None) or ""
        if top is not None and "site-packages" not in where and top not in mods:
            mods.append(top)
    return {"py_modules": mods} if mods else None


def connect_cluster(runtime_env: dict[str, Any] | None = None) -> None:
    """Join the Ray cluster (RAY_ADDRESS, else 'auto'), failing in one line when none answers.

    ray.init against a closed port retries for minutes, so the head is probed first.
    """
    address = ray_address()
    import ray

    if ray.is_initialized():
        return
    if address.startswith("ray://"):
        host, port = address_host(address), urllib.parse.urlsplit(address).port or 10001
        where = address
    else:
        from ray._private import services

        try:
            where = services.canonicalize_bootstrap_address(address) or address
        except ConnectionError:
            raise ConfigError(
                "--cluster: no running Ray cluster found (RAY_ADDRESS is not set and no `ray start` "
                "ran on this machine); start one or set RAY_ADDRESS=host:port"
            ) from None
        except ValueError as exc:
            raise ConfigError(f"--cluster: RAY_ADDRESS={address!r} is not host:port ({exc})") from None
        host, _, port_s = where.rpartition(":")
        port = int(port_s) if port_s.isdigit() else 6379
    reason = probe_tcp(host.strip("[]"), port)
    if reason:
        raise ConfigError(f"--cluster: no Ray cluster answers at {address} ({reason}); start it or fix RAY_ADDRESS")
    from sweeps.integrations.ray.session import stop_handlers_kept

    try:
        with _stderr_captured() as logged, stop_handlers_kept():  # Ctrl+C and SIGTERM stay the sweep's
            ray.init(address=address, logging_level=logging.WARNING, runtime_env=runtime_env)
    except Exception as exc:  # ConnectionError, authentication, version mismatch...
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ConfigError(
            f"--cluster: could not join the Ray cluster at {address}: {detail}{_auth_hint(detail)}"
        ) from None
    if logged and logged[0].strip():
        sys.stderr.write(logged[0])


AUTH_WORDS = ("unauthenticated", "authentication", "auth token", "permission denied", "invalid token")


def _auth_hint(detail: str) -> str:
    """What to check when the head answered on its port but refused the driver: Ray's token authentication
    (on by default for `ray start --head` clusters in Ray 2.60) says only 'Failed to connect' for a wrong token."""
    token_mode = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    has_token = bool(os.environ.get("RAY_AUTH_TOKEN")) or os.path.isfile(os.path.expanduser("~/.ray/auth_token"))
    if any(w in detail.lower() for w in AUTH_WORDS):
        return " (the cluster refused this driver's auth token: check RAY_AUTH_TOKEN or ~/.ray/auth_token)"
    if token_mode or has_token:
        return (
            " (the head answers on its port but did not let this driver join: most likely a wrong auth token; "
            "RAY_AUTH_TOKEN or ~/.ray/auth_token must be the cluster's)"
        )
    return (
        " (the head answers on its port but did not let this driver join: if the cluster uses token "
        "authentication, set RAY_AUTH_MODE=token and its RAY_AUTH_TOKEN)"
    )


def _alive_nodes() -> list[dict[str, Any]]:
    import ray

    try:
        return [n for n in ray.nodes() if n.get("Alive")]
    except Exception:  # Ray Client without the state API: one node with the cluster's totals
        return [{"Resources": ray.cluster_resources(), "NodeManagerAddress": ""}]


def _autoscaler(cpus: float, gpus: float) -> tuple[bool, str]:
    """(whether the cluster can add a node that fits one trial, what says so)."""
    if os.environ.get("CALIB_ASSUME_AUTOSCALING") == "1":
        return True, "CALIB_ASSUME_AUTOSCALING=1"
    try:
        import ray._private.state

        config = ray._private.state.state.get_cluster_config()
    except Exception:
        config = None
    if config is not None and config.node_group_configs:
        for group in config.node_group_configs:
            res = dict(group.resources)
            if group.max_count != 0 and res.get("CPU", 0) >= cpus and res.get("GPU", 0) >= gpus:
                return True, f"the autoscaler can add node type {group.name!r}"
        return False, "no node type the autoscaler can add is that large"
    try:  # autoscaler v1: its status; `ray start` clusters run it read-only (node types "node_<id>")
        from ray.experimental.internal_kv import _internal_kv_get

        status = json.loads(_internal_kv_get("__autoscaling_status") or b"{}")
        mapping = (status.get("autoscaler_report") or {}).get("node_type_mapping") or {}
        if any(kind != f"node_{node}" for node, kind in mapping.items()):
            return True, "an autoscaler is running"
    except Exception:
        pass
    try:  # autoscaler v2 (KubeRay's with Ray 2.60): it reports its state to the GCS every few seconds, but
        # no cluster config, so the node types it can add are not visible here; trials wait pending_timeout_s
        import ray
        from ray.autoscaler.v2.sdk import get_cluster_status

        status = get_cluster_status(ray.get_runtime_context().gcs_address)
        if int(status.stats.autoscaler_version or 0) > 0:
            return True, "an autoscaler (v2) is running"
    except Exception:
        pass
    return False, "the cluster has no autoscaler"


def _this_machine() -> set[str]:
    """This machine's addresses: the one Ray gives its nodes here, and its host name's."""
    out: set[str] = set()
    try:
        from ray.util import get_node_ip_address

        out.add(get_node_ip_address())
    except Exception:
        pass
    try:
        out.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return out


def check_cluster(cfg: SweepConfig, loopback_tracking: bool) -> None:
    """After joining: a loopback tracking URI only if every node runs on this machine; one trial must fit
    on one node, or the cluster must be able to add such a node (then resources.pending_timeout_s
    bounds the wait)."""
    import ray

    nodes = _alive_nodes()
    if loopback_tracking:
        here = _this_machine()
        far = sorted({n.get("NodeManagerAddress", "") for n in nodes} - {""})
        far = [a for a in far if not is_loopback(a) and a not in here]
        if far or not nodes:
            raise ConfigError(
                f"tracking.uri: {redact(cfg.tracking.uri or '')!r} is a loopback address but the "
                f"cluster has nodes on other machines ({', '.join(far) or 'unknown addresses'}); use "
                "an address every node can reach"
            )
    r = cfg.resources
    cpus, gpus = r.cpus_per_trial, r.gpus_per_trial

    def has(n: dict[str, Any], key: str) -> float:
        return float(n.get("Resources", {}).get(key, 0.0))

    if any(has(n, "CPU") >= cpus and has(n, "GPU") >= gpus for n in nodes):
        total = ray.cluster_resources()
        print(f"Ray cluster: {len(nodes)} node(s), {total.get('CPU', 0):g} CPU, {total.get('GPU', 0):g} GPU")
        return
    scales, why = _autoscaler(cpus, gpus)
    cpu_short = not any(has(n, "CPU") >= cpus for n in nodes)
    gpu_short = not any(has(n, "GPU") >= gpus for n in nodes)
    field = (
        "resources.gpus_per_trial"
        if gpu_short and not cpu_short
        else "resources.cpus_per_trial"
        if cpu_short and not gpu_short
        else "resources.cpus_per_trial/gpus_per_trial"
    )
    big = max(nodes, key=lambda n: (has(n, "GPU"), has(n, "CPU")), default={})
    total = ray.cluster_resources()
    ask = f"a trial asks for {cpus:g} CPU and {gpus:g} GPU on one node"
    have = (
        f"the largest node has {has(big, 'CPU'):g} CPU and {has(big, 'GPU'):g} GPU (cluster: {len(nodes)} "
        f"node(s), {total.get('CPU', 0):g} CPU, {total.get('GPU', 0):g} GPU)"
    )
    if scales and r.pending_timeout_s is not None:
        print(
            f"{field}: {ask}; {have}; {why}: waiting at most {r.pending_timeout_s:g} s for it "
            "(resources.pending_timeout_s)"
        )
        return
    if scales:
        print(f"{field}: {ask}; {have}; {why}: waiting for it (resources.pending_timeout_s: null)")
        return
    raise ConfigError(
        f"{field}: {ask} but {have}, and {why}; lower the request or add a node "
        "(CALIB_ASSUME_AUTOSCALING=1 waits resources.pending_timeout_s for one)"
    )
