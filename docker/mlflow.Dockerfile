# syntax=docker/dockerfile:1
#
# MLflow tracking server for the sweep service: PostgreSQL backend store (psycopg 3: SQLAlchemy 2.1
# maps postgresql:// DSNs to it; with psycopg2 alone the server fails to start), S3 / MinIO
# artifacts proxied by the server (boto3, --serve-artifacts), and the basic-auth app
# (mlflow[auth] -> Flask-WTF), Prometheus metrics (--expose-prometheus: prometheus-flask-exporter, served to
# Prometheus by docker/mlflow-metrics). Runs as a non-root user. `mlflow-db-upgrade` (the Deployment's init
# containers) waits for the database and migrates both schemas before the server starts.
#
#   docker build -f docker/mlflow.Dockerfile -t REGISTRY/calib-sweeps/mlflow:0.1.0 .
#
# Versions come from constraints.txt (the one place they are chosen) through the hash lock
# docker/locks/mlflow-image.txt; tests/unit/deploy/test_deploy_consistency.py checks the two agree.
# Base: the Python Official Image, slim Debian bookworm, pinned by its multi-platform index digest (the
# same image as docker/Dockerfile). Record: docker-library/repo-info,
# repos/python/remote/3.11.15-slim-bookworm.md at commit 3effc3eac4f65a99767fd721667a1bf157496ba4
# (python:3.11.15-slim-bookworm, index sha256:d29f48a31a8b408ed19272ca1e7b10ebae13b240a27e862d3d4217c528e2e0c3;
# linux/amd64 built Wed, 05 Aug 2026, layers last modified 2026-08-05 01:14 GMT).
FROM python:3.11.15-slim-bookworm@sha256:d29f48a31a8b408ed19272ca1e7b10ebae13b240a27e862d3d4217c528e2e0c3

LABEL org.opencontainers.image.title="calib-sweeps-mlflow" \
      org.opencontainers.image.description="MLflow tracking server (PostgreSQL, S3 artifacts, basic auth)"

# MLFLOW_DISABLE_TELEMETRY / DO_NOT_TRACK: MLflow 3 sends usage telemetry unless one is set.
ENV PYTHONUNBUFFERED=1 \
    GIT_PYTHON_REFRESH=quiet \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MLFLOW_AUTH_CONFIG_PATH=/tmp/mlflow/basic_auth.ini \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=true

RUN groupadd --system --gid 10001 mlflow \
 && useradd --system --uid 10001 --gid mlflow --home-dir /home/mlflow --create-home --shell /usr/sbin/nologin mlflow

# docker/locks/mlflow-image.txt: docker/locks/mlflow-image.in's closure, versions from constraints.txt,
# every file pinned by its sha256 (docker/locks/compile.sh); pip installs exactly that list.
COPY docker/locks/mlflow-image.txt /tmp/mlflow-image.lock
RUN pip install --no-cache-dir --require-hashes --no-deps -r /tmp/mlflow-image.lock \
 && rm /tmp/mlflow-image.lock \
 && pip check \
 && MLFLOW_AUTH_CONFIG_PATH="" python -c "import mlflow, mlflow.db, mlflow.server.auth.db.cli as a, psycopg, boto3, flask_wtf, sqlalchemy.dialects.postgresql.psycopg, prometheus_flask_exporter.multiprocess, prometheus_client.multiprocess; assert callable(mlflow.db.upgrade.callback) and callable(a.upgrade.callback); print('mlflow', mlflow.__version__)"

COPY --chmod=0755 docker/mlflow-entrypoint.sh /usr/local/bin/mlflow-entrypoint.sh
# Init containers: wait for the database, then `mlflow db upgrade` (tracking and basic-auth schemas).
COPY --chmod=0755 docker/mlflow-db-upgrade /usr/local/bin/mlflow-db-upgrade
COPY --chmod=0755 docker/mlflow-healthcheck /usr/local/bin/mlflow-healthcheck
# The Deployment's `metrics` sidecar: serves the server's Prometheus metrics (--expose-prometheus, written by its
# workers to a shared directory) on a port of their own, without MLflow's basic auth (docker/mlflow-metrics).
COPY --chmod=0755 docker/mlflow-metrics /usr/local/bin/mlflow-metrics

USER 10001:10001
WORKDIR /home/mlflow
EXPOSE 5000

# /health needs neither authentication nor an allowed Host header; Kubernetes uses the same
# endpoint for its liveness/readiness probes (deploy/base/mlflow/deployment.yaml). HTTPS first, then HTTP.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 CMD ["mlflow-healthcheck"]

ENTRYPOINT ["/usr/local/bin/mlflow-entrypoint.sh"]
CMD ["--host", "0.0.0.0", "--port", "5000", "--app-name", "basic-auth", "--serve-artifacts"]
