"""Keep a Ray pod's logs after the pod is gone: copy Ray's log directory to the object store.

Runs as the `ray-logs` sidecar of every Ray pod (head and workers, deploy/base/ray/), with the pod's
/tmp (Ray's session directory) mounted read-only. Every RAY_LOGS_INTERVAL seconds (300) it copies the
files under /tmp/ray/session_*/logs that are new or changed since the last pass to

    $RAY_LOGS_URI/<ray cluster>/<pod>/<session>/<path under logs/>

and once more when the pod stops (SIGTERM: KubeRay deletes the cluster when the RayJob ends, or a node
is drained), then exits 0. RAY_LOGS_URI is any URI pyarrow opens: s3://bucket/prefix (credentials and
AWS_ENDPOINT_URL from the environment, as Ray Tune's storage path uses them) or file:///path.
A file is copied whole each time it changed (Ray appends to its logs), so the interval trades the
object store's traffic against what a pod killed without notice loses. Expire old logs with a
lifecycle rule on the bucket. Standard library and pyarrow only (both in the Ray image).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from pyarrow import fs


def destination(uri: str, cluster: str, pod: str) -> tuple[fs.FileSystem, str]:
    filesystem, path = fs.FileSystem.from_uri(uri.rstrip("/"))
    return filesystem, f"{path.rstrip('/')}/{cluster}/{pod}"


def sync(ray_tmp: Path, filesystem: fs.FileSystem, prefix: str, seen: dict[str, tuple[int, int]]) -> int:
    """Copy what is new or changed since SEEN; return how many files were copied."""
    copied = 0
    for session in sorted(ray_tmp.glob("session_2*")):  # session_<date>_..., not the session_latest link
        logs = session / "logs"
        if not logs.is_dir():
            continue
        for root, _, files in os.walk(logs):
            for name in files:
                src = Path(root) / name
                try:
                    st = src.stat()
                except FileNotFoundError:  # Ray rotates and removes files while we walk
                    continue
                key = (st.st_size, st.st_mtime_ns)
                if seen.get(str(src)) == key:
                    continue
                target = f"{prefix}/{session.name}/{src.relative_to(logs).as_posix()}"
                filesystem.create_dir(target.rsplit("/", 1)[0], recursive=True)
                try:
                    with open(src, "rb") as fin, filesystem.open_output_stream(target) as out:
                        while chunk := fin.read(1 << 20):
                            out.write(chunk)
                except FileNotFoundError:
                    continue
                seen[str(src)] = key
                copied += 1
    return copied


def main() -> int:
    uri = os.environ.get("RAY_LOGS_URI", "")
    if not uri:
        print("ray-logs: RAY_LOGS_URI is not set; nothing to do", file=sys.stderr, flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        signal.sigwait({signal.SIGTERM, signal.SIGINT})  # a sidecar that exits would be restarted
        return 0
    interval = float(os.environ.get("RAY_LOGS_INTERVAL", "300"))
    ray_tmp = Path(os.environ.get("RAY_TMP", "/tmp/ray"))
    cluster = os.environ.get("RAY_CLUSTER") or "unknown-cluster"
    pod = os.environ.get("POD_NAME") or os.uname().nodename
    filesystem, prefix = destination(uri, cluster, pod)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    seen: dict[str, tuple[int, int]] = {}
    print(f"ray-logs: copying {ray_tmp}/session_*/logs to {uri}/{cluster}/{pod} every {interval:g} s", flush=True)
    while True:
        stopping = stop.wait(interval)
        try:
            n = sync(ray_tmp, filesystem, prefix, seen)
            if n:
                print(f"ray-logs: {n} file(s) copied", flush=True)
        except Exception as exc:  # the object store away for a while: try again next pass
            print(f"ray-logs: copy failed ({type(exc).__name__}: {exc}); retrying", file=sys.stderr, flush=True)
            if stopping:
                return 1
        if stopping:
            return 0


if __name__ == "__main__":
    sys.exit(main())
