# Stand-in for postgres:<ver>-bookworm (Docker Hub is not reachable here). Honours the official
# image's contract that deploy/overlays/dev/postgres.yaml uses: user postgres uid/gid 999, PGDATA
# (default /var/lib/postgresql/data), POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB on first
# start, password (scram-sha-256) for TCP clients, listen on all addresses, the socket in
# /var/run/postgresql, pg_isready on PATH, ENTRYPOINT docker-entrypoint.sh, CMD postgres,
# STOPSIGNAL SIGINT. Difference: Debian bookworm's PostgreSQL 15 (the tag names 17).
FROM calib-standin/debian:bookworm
ENV LANG=C.UTF-8
# hadolint ignore=DL3008
RUN groupadd -r postgres --gid=999 \
 && useradd -r -g postgres --uid=999 --home-dir=/var/lib/postgresql --shell=/bin/bash postgres \
 && mkdir -p /var/lib/postgresql /etc/postgresql-common/createcluster.d \
 && chown -R postgres:postgres /var/lib/postgresql \
 && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/stand-in.conf \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/*
ENV PG_MAJOR=15 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/lib/postgresql/15/bin \
    PGDATA=/var/lib/postgresql/data
RUN install -d -o postgres -g postgres -m 3777 /var/run/postgresql \
 && install -d -o postgres -g postgres -m 1777 "$PGDATA"
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
STOPSIGNAL SIGINT
EXPOSE 5432
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
