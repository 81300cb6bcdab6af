# The sticksat service image: the service side only (numpy, ortools, FastAPI, uvicorn),
# no torch. `pip install -c constraints.txt .` installs exactly pyproject's base
# dependencies at the tested versions (the torch extra is never requested). Needs
# BuildKit (the default builder since Docker 23; `DOCKER_BUILDKIT=1` on Docker 20.10).
#
#   docker build -t sticksat .
#   docker run -p 8000:8000 -v sticksat-data:/data sticksat serve
#   docker run --rm --user "$(id -u):$(id -g)" -v "$PWD:/w" sticksat compile /w/graph.json -o /w/program.json
#
# BASE is the official python:3.11-slim-bookworm pinned by its multi-arch index digest
# (docs/container.md says where the digest comes from). Any Debian-like base with
# `python3 -m venv` works: CI builds on a base made from Debian's packages
# (scripts/make_base_image.sh) with `--build-arg BASE=sticksat-base:bookworm`.
# A builder whose pip needs its own configuration (index, CA bundle) passes it as the
# secrets `pip.conf` / `pip-cert` (scripts/image_pip_config.py; .ci/container.sh does);
# secrets never land in a layer.
#
# One filesystem layer on top of the base (the vfs storage driver copies every layer
# whole): the build context is bind-mounted, not COPYed; .dockerignore lists exactly what
# it holds. tests/test_service_install.py replays the install step into a clean venv.
ARG BASE=python:3.11-slim-bookworm@sha256:0bee7276f83efd4a1ee05bbbf4281d95ed28e079220a9457f25a93e3f1e3c31b
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# The service into /opt/venv (python3: a slim image also has `python`, a Debian base only
# `python3`), then an unprivileged user; the store lives on a volume it owns.
RUN --mount=type=bind,target=/context \
    --mount=type=secret,id=pip.conf,required=false \
    --mount=type=secret,id=pip-cert,required=false \
    set -eu; \
    if [ -f /run/secrets/pip.conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip.conf; fi; \
    tmp="$(mktemp -d)"; \
    cp -r /context "$tmp/src"; \
    python3 -m venv /opt/venv; \
    cd "$tmp/src" && pip install -c constraints.txt . && cd "$HOME" && rm -rf "$tmp" "$HOME/.cache"; \
    find /opt/venv -name __pycache__ -prune -exec rm -rf {} +; \
    useradd --create-home --uid 10001 --shell /usr/sbin/nologin sticksat; \
    mkdir -p /data /w; \
    chown sticksat /data /w

USER sticksat
ENV STICKSAT_STORE=/data/store.sqlite \
    STICKSAT_HOST=0.0.0.0 \
    STICKSAT_PORT=8000
VOLUME ["/data"]
WORKDIR /w
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('STICKSAT_PORT', '8000') + '/healthz', timeout=4)"]

ENTRYPOINT ["sticksat"]
CMD ["serve"]
