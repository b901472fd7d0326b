#!/opt/s3/bin/python
"""`minio server` stand-in: moto's S3 in server mode behind MinIO's command line, credentials and
health endpoints (see s3.Dockerfile for what is and is not like MinIO)."""

import argparse
import os
import re
import sys
from urllib.parse import parse_qs

from moto.server import create_backend_app
from werkzeug.serving import run_simple

HEADER_KEY = re.compile(r"Credential=([^/,\s]+)/")
DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code>'
    b"<Message>The Access Key Id you provided does not exist in our records.</Message></Error>"
)


def access_key(environ) -> str | None:
    m = HEADER_KEY.search(environ.get("HTTP_AUTHORIZATION", ""))
    if m:
        return m.group(1)
    cred = parse_qs(environ.get("QUERY_STRING", "")).get("X-Amz-Credential", [""])[0]
    return cred.split("/", 1)[0] or None


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "server":
        print("usage: minio server DIR [--address :9000] [--console-address :9001] [--certs-dir D]", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="minio server")
    p.add_argument("dirs", nargs="+")
    p.add_argument("--address", default=":9000")
    p.add_argument("--console-address", default=":9001")
    p.add_argument("--certs-dir")
    args = p.parse_args(argv[1:])
    user, password = os.environ.get("MINIO_ROOT_USER", ""), os.environ.get("MINIO_ROOT_PASSWORD", "")
    if len(user) < 3 or len(password) < 8:
        print(
            "ERROR Unable to validate credentials: MINIO_ROOT_USER (>= 3 characters) and "
            "MINIO_ROOT_PASSWORD (>= 8 characters) must be set",
            file=sys.stderr,
        )
        return 1
    for d in args.dirs:  # MinIO refuses a data directory it cannot write
        probe = os.path.join(d, ".minio-standin-write-check")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    host, _, port = args.address.rpartition(":")
    s3 = create_backend_app("s3")  # path-style S3 only, as the clients here address it

    def app(environ, start_response):
        if environ.get("PATH_INFO") in ("/minio/health/live", "/minio/health/ready"):
            start_response("200 OK", [("Content-Length", "0")])
            return [b""]
        if access_key(environ) != user:
            start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(DENIED)))])
            return [DENIED]
        return s3(environ, start_response)

    print(f"S3-API: http://{host or '0.0.0.0'}:{port} (stand-in: moto S3, objects in memory)", flush=True)
    run_simple(host or "0.0.0.0", int(port), app, threaded=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
