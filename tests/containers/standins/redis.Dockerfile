# Stand-in for the highly available Redis that deploy/components/gcs-ft points the Ray head at (an external
# service, not in the overlays; Docker Hub is not reachable here): Debian bookworm's redis-server, listening
# on all addresses, the password from REDIS_PASSWORD (requirepass), no persistence (the test restarts the
# Ray head, never Redis). Runs as the unprivileged user redis.
FROM calib-standin/debian:bookworm
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/*
USER redis
EXPOSE 6379
# hadolint ignore=DL3025
ENTRYPOINT ["sh", "-c", "exec redis-server --bind 0.0.0.0 --protected-mode no --save '' --appendonly no --requirepass \"$REDIS_PASSWORD\""]
