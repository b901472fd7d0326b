#!/bin/sh
# Start `mlflow server` with the basic-auth app, writing its config file from the environment so
# that no credential lives in the image or in a ConfigMap.
#
# Environment (all credentials come from Kubernetes Secrets):
#   MLFLOW_AUTH_DATABASE_URI        users/permissions database (required; e.g. the same PostgreSQL)
#   MLFLOW_AUTH_DEFAULT_PERMISSION  READ (default) | EDIT | MANAGE | NO_PERMISSIONS
#   MLFLOW_AUTH_CONFIG_PATH         where to write basic_auth.ini (default /tmp/mlflow/basic_auth.ini)
#   MLFLOW_AUTH_CACHE_TTL_SECONDS   how long each server worker keeps a verified user and password (default 30;
#                                   0: MLflow's default, the password hash checked on every request, 0.27 s of CPU
#                                   each: benchmarks/results/bench_mlflow_auth.md). A password changed or a user deleted
#                                   through MLflow's API takes effect at once on the worker that served the change and
#                                   within this many seconds on the others (and for changes made in the database).
#   MLFLOW_AUTH_ADMIN_USERNAME / MLFLOW_AUTH_ADMIN_PASSWORD  read by MLflow itself to create the
#                                   admin user on first start (MLflow ships no default password)
#   MLFLOW_FLASK_SERVER_SECRET_KEY  CSRF secret of the auth app (same value on every replica)
#   MLFLOW_BACKEND_STORE_URI, MLFLOW_ARTIFACTS_DESTINATION, MLFLOW_SERVER_ALLOWED_HOSTS, ...
#                                   read by `mlflow server` as its option defaults
#   PROMETHEUS_MULTIPROC_DIR        where the server's workers write their Prometheus metrics (default
#                                   /tmp/mlflow/prometheus; the Deployment: the volume it shares with the `metrics`
#                                   sidecar, docker/mlflow-metrics). Passed as `--expose-prometheus DIR`; emptied of
#                                   the previous start's files first, as prometheus_client's multiprocess mode
#                                   requires (an emptyDir outlives a container restart). Empty: no metrics.
# Arguments are passed to `mlflow server` after --expose-prometheus.
set -eu

: "${MLFLOW_AUTH_DATABASE_URI:?MLFLOW_AUTH_DATABASE_URI is not set (users database of the basic-auth app)}"
cfg="${MLFLOW_AUTH_CONFIG_PATH:-/tmp/mlflow/basic_auth.ini}"
permission="${MLFLOW_AUTH_DEFAULT_PERMISSION:-READ}"
ttl="${MLFLOW_AUTH_CACHE_TTL_SECONDS:-30}"
bad_ttl() {
  echo "MLFLOW_AUTH_CACHE_TTL_SECONDS must be whole seconds from 0 to 3600 (0 turns the cache off), not '$ttl'" >&2
  exit 2
}
case "$ttl" in
  *[!0-9]*) bad_ttl ;;
esac
# the length first: a number past the shell's integers is not compared, it is refused
if [ "${#ttl}" -gt 4 ] || [ "$ttl" -gt 3600 ]; then
  bad_ttl
fi

umask 077
mkdir -p "$(dirname "$cfg")"
# configparser interpolates '%': double it so URL-encoded passwords survive.
db_uri=$(printf '%s' "$MLFLOW_AUTH_DATABASE_URI" | sed 's/%/%%/g')
cat > "$cfg" <<INI
[mlflow]
default_permission = ${permission}
database_uri = ${db_uri}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = ${ttl}
INI
export MLFLOW_AUTH_CONFIG_PATH="$cfg"

# MLflow hands DIR to its workers as `prometheus_multiproc_dir`; prometheus_client prefers PROMETHEUS_MULTIPROC_DIR
# when that is set, so it is exported as the same directory: the two names can never point apart.
metrics_dir="${PROMETHEUS_MULTIPROC_DIR-/tmp/mlflow/prometheus}"
if [ -n "$metrics_dir" ]; then
  mkdir -p "$metrics_dir"
  rm -f "$metrics_dir"/*.db
  export PROMETHEUS_MULTIPROC_DIR="$metrics_dir"
  exec mlflow server --expose-prometheus "$metrics_dir" "$@"
fi
unset PROMETHEUS_MULTIPROC_DIR
exec mlflow server "$@"
