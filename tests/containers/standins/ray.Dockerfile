# Stand-in for rayproject/ray:<ray>-py311-cpu (Docker Hub is not reachable here), built on the
# debootstrapped Debian bookworm base. It honours what docker/Dockerfile and KubeRay rely on:
#   user ray, uid 1000, gid 100 (users), HOME=/home/ray, WORKDIR /home/ray, passwordless sudo;
#   Python 3.11 and Ray at /home/ray/anaconda3 (bin/python, bin/pip, bin/ray first on PATH);
#   bash at /bin/bash (KubeRay runs `/bin/bash -c -- "ulimit -n ...; ray start ..."`), wget;
#   LANG/LC_ALL=C.UTF-8, TZ; `ray` installed with the dashboard and Tune (the real image has
#   ray[all]). Differences: a venv on Debian's Python 3.11.2 instead of conda, Debian instead of
#   Ubuntu, only the default and tune extras.
FROM calib-standin/debian:bookworm
ARG RAY_VERSION=2.60.0
ENV TZ=America/Los_Angeles \
    LC_ALL=C.UTF-8 \
    LANG=C.UTF-8 \
    PATH=/home/ray/anaconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv ca-certificates sudo wget tzdata netbase procps \
 && rm -rf /var/lib/apt/lists/* \
 && useradd -ms /bin/bash -d /home/ray ray --uid 1000 --gid 100 \
 && usermod -aG sudo ray \
 && echo 'ray ALL=NOPASSWD: ALL' >> /etc/sudoers
USER 1000
ENV HOME=/home/ray
WORKDIR /home/ray
RUN python3 -m venv /home/ray/anaconda3 \
 && pip install --no-cache-dir "ray[default,tune]==${RAY_VERSION}" \
 && pip freeze > /home/ray/pip-freeze.txt \
 && python -c "import ray; assert ray.__version__ == '${RAY_VERSION}'"
CMD ["bash"]
