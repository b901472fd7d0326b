# Stand-in for python:3.11.x-slim-bookworm (Docker Hub is not reachable here): Debian bookworm
# with the interpreter where the official image has it: /usr/local/bin/python, python3, pip, and
# site-packages in /usr/local/lib/python3.11/site-packages (a venv rooted at /usr/local over
# Debian's Python 3.11.2), PATH starting with /usr/local/bin, LANG=C.UTF-8, user root, CMD python3.
FROM calib-standin/debian:bookworm
ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv ca-certificates netbase tzdata \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /usr/local \
 && /usr/local/bin/python -c "import sys; assert sys.prefix == '/usr/local' and sys.version_info[:2] == (3, 11)"
ENV PYTHON_VERSION=3.11.2
CMD ["python3"]
