# The sticksat service image: the service side only (numpy, ortools, FastAPI, uvicorn);
# no torch. `pip install -c constraints.txt .` installs exactly pyproject's base
# dependencies at the tested versions (the torch extra is never requested).
#
#   docker build -t sticksat .
#   docker run -p 8000:8000 -v sticksat-data:/data sticksat serve
#   docker run -v $PWD:/w sticksat compile /w/graph.json
#
# tests/test_service_install.py replays the COPY/RUN steps below into a clean venv (no
# Docker engine needed) and runs both commands from it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY backend ./backend
COPY lowering ./lowering
COPY solver ./solver
COPY simulator ./simulator
COPY service ./service
COPY calibration ./calibration
RUN pip install -c constraints.txt . && cd / && rm -rf /src

# Unprivileged user; the store lives on a volume it owns.
RUN useradd --create-home --uid 10001 sticksat && mkdir -p /data /w && chown sticksat /data /w
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
