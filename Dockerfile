# syntax=docker/dockerfile:1
#
# cuzkd container image: the supervisor runs as PID 1 (it reaps zombies and forwards signals
# itself, so no tini/dumb-init), as a non-root user, with its config at /etc/cuzkd/cuzkd.toml.
#
# CPU image (NumPy engine):
#   docker build -t cuzkd .
# GPU image (CuPy engine, CUDA 12 runtime; run with --gpus all):
#   docker build -t cuzkd:gpu \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04 --build-arg EXTRAS=gpu .
#
# BASE_IMAGE is used for both stages, so the virtual environment built in the first stage runs
# on the same Python and libc in the second. Bases without Python (the CUDA images) get the
# distribution's python3 (3.12 on Ubuntu 24.04; cuzkd needs >= 3.11).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS builder
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
# Versions are not pinned: this line serves two distributions (Debian for the default base,
# Ubuntu for the CUDA bases) whose package versions differ; the base image tag pins them.
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null 2>&1 || ! python3 -c "import ensurepip" 2>/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 python3-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv /opt/cuzkd
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cuzkd ./cuzkd
# Installs cuzkd and its dependencies (pinned by pyproject.toml's lower bounds and the wheel
# index at build time) into the venv; EXTRAS=gpu adds cupy-cuda12x.
# Behind a TLS-intercepting proxy the package index needs the host's CA bundle: pass it as a
# build secret (`--secret id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt`). A secret is
# mounted for this one step only, so the certificate never reaches a layer of either stage.
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && /opt/cuzkd/bin/pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}"

FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
# Same reasoning as in the builder: one line for two distributions.
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null 2>&1; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --system --gid 10001 cuzkd \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/cuzkd \
         --shell /usr/sbin/nologin cuzkd \
    && install -d -o cuzkd -g cuzkd -m 0750 /var/lib/cuzkd /run/curio \
    && install -d -m 0755 /etc/cuzkd
COPY --from=builder /opt/cuzkd /opt/cuzkd
COPY deploy/cuzkd.toml /etc/cuzkd/cuzkd.toml
ENV PATH=/opt/cuzkd/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Swap releases, the control socket and engine sockets; a cuzk engine's front door (its
# socket at cuzk's default unix:///run/curio/cuzk.sock, mode 0660, group 10001): share this
# volume with Curio's container, run with --group-add 10001.
VOLUME ["/var/lib/cuzkd", "/run/curio"]
# The only TCP listener: /metrics, /status and /healthz (read-only).
EXPOSE 9822
# Numeric, so that runtimes can verify "non-root" without reading /etc/passwd.
USER 10001:10001
WORKDIR /var/lib/cuzkd
# No curl in the slim image: Python's urllib exits non-zero on a refused connection or a
# non-2xx answer. With TLS on the listener ([metrics] web_config), run the container with
# -e CUZKD_HEALTHZ_URL=https://127.0.0.1:9822/healthz: /healthz needs no password, and the
# certificate is not verified, as kubelet's HTTPS probes do not verify it (a liveness check
# of the process beside it over loopback, sending nothing secret). A web config requiring a
# client certificate (RequireAndVerifyClientCert) fails this check: use VerifyClientCertIfGiven.
ENV CUZKD_HEALTHZ_URL=http://127.0.0.1:9822/healthz
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python3", "-c", "import os, ssl, urllib.request; urllib.request.urlopen(os.environ['CUZKD_HEALTHZ_URL'], timeout=4, context=ssl._create_unverified_context())"]
# cuzkd stops its engines within shutdown_grace (30 s): run with --stop-timeout 45 (compose.yaml
# sets stop_grace_period), or Docker's default 10 s kills engines mid-proof.
STOPSIGNAL SIGTERM
ENTRYPOINT ["cuzkd", "run", "--config", "/etc/cuzkd/cuzkd.toml"]
