# Stand-in for quay.io/minio/minio (not reachable here): an S3-compatible server from PyPI
# (moto's S3 in server mode) behind the same interface deploy/overlays/dev/minio.yaml uses:
# `minio server DIR --address :9000 --console-address :9001 [--certs-dir D]`,
# MINIO_ROOT_USER / MINIO_ROOT_PASSWORD (requests signed with another access key id get 403),
# GET /minio/health/live and /minio/health/ready, any uid, read-only root filesystem.
# Differences: objects live in memory (nothing in DIR survives a restart), the signature itself
# is not verified (only the access key id), no console.
FROM calib-standin/debian:bookworm
ENV LANG=C.UTF-8 \
    PATH=/opt/s3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/s3 \
 && /opt/s3/bin/pip install --no-cache-dir "moto[server]==5.2.5" \
 && /opt/s3/bin/python -c "import moto.server"
COPY --chmod=0755 minio-standin.py /usr/bin/minio
COPY --chmod=0755 minio-entrypoint.sh /usr/bin/docker-entrypoint.sh
EXPOSE 9000
ENTRYPOINT ["/usr/bin/docker-entrypoint.sh"]
CMD ["minio"]
