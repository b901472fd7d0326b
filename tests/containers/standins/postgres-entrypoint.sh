#!/usr/bin/env bash
# Stand-in for the official postgres image's docker-entrypoint.sh (the parts deploy/ uses): on
# first start (no PG_VERSION in $PGDATA) initdb as $POSTGRES_USER with $POSTGRES_PASSWORD,
# password auth for TCP clients, create $POSTGRES_DB; then exec postgres on all addresses.
# Runs as the non-root uid it is started with (the manifest's runAsUser 999).
set -Eeo pipefail
if [ "${1:0:1}" = '-' ]; then set -- postgres "$@"; fi
if [ "$1" != 'postgres' ]; then exec "$@"; fi
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${PGDATA:?}"
mkdir -p "$PGDATA"
chmod 00700 "$PGDATA" || :
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "Error: Database is uninitialized and superuser password is not specified (POSTGRES_PASSWORD)." >&2
    exit 1
  fi
  initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
    --auth-local=trust --auth-host=scram-sha-256 -D "$PGDATA" ${POSTGRES_INITDB_ARGS:-} >/dev/null
  printf '\nhost all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start >/dev/null
  if [ "$POSTGRES_DB" != postgres ]; then
    psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --dbname postgres \
      -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
  fi
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "PostgreSQL init process complete; ready for start up."
fi
exec postgres -c listen_addresses='*' "${@:2}"
