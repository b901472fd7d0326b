#!/bin/sh
# As MinIO's image: arguments that do not start with "minio" are arguments of minio.
if [ "${1}" != "minio" ] && [ -n "${1}" ]; then
  set -- minio "$@"
fi
exec "$@"
