"""What the Docker image holds and runs, without a Docker engine.

The slow tests replay the Dockerfile's install step into a clean virtualenv (no torch):
the build context is what .dockerignore lets through (an allowlist), and the step's
`pip install -c constraints.txt .` runs on a copy of it; then `sticksat serve` and
`sticksat compile` run from that venv. Slow (a fresh venv and a pip install; pip's cache
is reused between runs) and needs the package index (or a populated pip cache).
.ci/container.sh builds and runs the real image where a Docker engine runs.

The fast tests check the Dockerfile's promises (base pinned by digest, non-root user,
python3 only, one install step) and scripts/image_pip_config.py, which hands this
machine's pip configuration to the build."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import httpx
import pytest

from service_helpers import ServiceProcess, chain_graph

REPO = Path(__file__).resolve().parent.parent
PIP_CACHE = Path(os.environ.get("STICKSAT_TEST_PIP_CACHE", Path.home() / ".cache" / "sticksat-test-pip"))
sys.path.insert(0, str(REPO / "scripts"))
import image_pip_config  # noqa: E402


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per Dockerfile instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _context_entries() -> tuple[list[str], list[str]]:
    """.dockerignore as an allowlist: (entries let in, patterns excluded again)."""
    lines = [l.strip() for l in (REPO / ".dockerignore").read_text().splitlines()]
    lines = [l for l in lines if l and not l.startswith("#")]
    assert lines[0] == "*", ".dockerignore must start with '*' (an allowlist)"
    allowed = [l[1:] for l in lines[1:] if l.startswith("!")]
    excluded = [l for l in lines[1:] if not l.startswith("!")]
    return allowed, excluded


def _install_step() -> tuple[str, list[str]]:
    """The RUN that installs: (where it copies the bind-mounted context, pip install argv)."""
    runs = [rest for word, rest in _instructions() if word == "RUN" and "pip install" in rest]
    assert len(runs) == 1, "exactly one RUN installs the package"
    run = runs[0]
    mount = re.search(r"--mount=type=bind,target=(\S+)", run)
    assert mount, "the install step bind-mounts the build context"
    segments = [seg.strip() for seg in re.split(r"&&|;", run)]
    copy = next(seg for seg in segments if seg.startswith(f"cp -r {mount.group(1)} "))
    install = next(seg for seg in segments if seg.startswith("pip install"))
    return copy.split()[-1], install.split()[1:]


def _clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    env["PIP_CACHE_DIR"] = str(PIP_CACHE)
    env["HF_HUB_OFFLINE"] = "1"
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("image")
    src = base / "src"
    src.mkdir()
    _, install = _install_step()
    allowed, excluded = _context_entries()
    ignore = shutil.ignore_patterns(*(pattern.rsplit("/", 1)[-1] for pattern in excluded))
    for name in allowed:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    venv = base / "venv"
    # Build the venv from the interpreter the test runs on, without its site-packages.
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
    env = _clean_env(venv)
    result = subprocess.run([str(venv / "bin" / "pip"), *install], cwd=src, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return venv


@pytest.mark.slow
def test_image_install_has_no_torch_and_the_package_is_the_installed_copy(installed, tmp_path):
    env = _clean_env(installed)
    python = str(installed / "bin" / "python")
    probe = subprocess.run([python, "-c", "import importlib.util as u, json, service; print(json.dumps("
                            "{'torch': u.find_spec('torch') is not None, 'service': service.__file__}))"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    found = json.loads(probe.stdout)
    assert found["torch"] is False
    assert str(installed) in found["service"]
    version = subprocess.run([str(installed / "bin" / "sticksat"), "version"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, check=True)
    assert json.loads(version.stdout)["sticksat"]


@pytest.mark.slow
def test_image_compile_command(installed, tmp_path):
    # docker run -v $PWD:/w IMAGE compile /w/graph.json
    env = _clean_env(installed)
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps(chain_graph(rows=64, n_ops=2)))
    out = tmp_path / "program.json"
    result = subprocess.run([str(installed / "bin" / "sticksat"), "compile", str(graph), "--planner", "naive",
                             "-o", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    program = json.loads(out.read_text())
    assert program["format"] == "sticksat.superdsc" and program["ops"]


@pytest.mark.slow
def test_image_serve_command(installed, tmp_path):
    # docker run IMAGE serve
    env = _clean_env(installed)
    server = ServiceProcess(tmp_path / "store.sqlite", tmp_path / "server.log", ["--workers", "1"],
                            command=[str(installed / "bin" / "sticksat")], env=env)
    server.start()
    try:
        assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}
        graph = chain_graph(rows=64, n_ops=2)
        resp = httpx.post(server.url + "/compile", json={"graph": graph, "options": {"planner": "naive"}},
                          timeout=120)
        assert resp.status_code == 200, resp.text
        assert resp.json()["program"]["format"] == "sticksat.superdsc"
    finally:
        server.stop()


# -- the Dockerfile's promises (fast) ---------------------------------------------------

def test_base_image_is_a_build_argument_pinned_by_digest():
    instructions = _instructions()
    args = [rest for word, rest in instructions if word == "ARG" and rest.startswith("BASE=")]
    assert len(args) == 1
    default = args[0].split("=", 1)[1]
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", default), default
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert froms == ["${BASE}"]
    # The digest the docs name is the one the Dockerfile pins.
    assert default.split("@", 1)[1] in (REPO / "docs" / "container.md").read_text()


def test_image_runs_as_an_unprivileged_user_with_python3_only():
    instructions = _instructions()
    users = [rest for word, rest in instructions if word == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0")
    # Everything after the last USER runs unprivileged; nothing switches back.
    last_user = max(i for i, (word, _) in enumerate(instructions) if word == "USER")
    assert not any(word == "RUN" for word, _ in instructions[last_user:])
    run = next(rest for word, rest in instructions if word == "RUN" and "pip install" in rest)
    assert "useradd" in run and users[-1] in run
    # A Debian base has only `python3`; the venv's `python` exists on every base.
    assert "python3 -m venv /opt/venv" in run
    env = " ".join(rest for word, rest in instructions if word == "ENV")
    assert "PATH=/opt/venv/bin:$PATH" in env
    # Secrets (the builder's pip configuration) are mounted, never copied into a layer.
    assert not any(word in ("COPY", "ADD") for word, _ in instructions)
    assert "--mount=type=secret,id=pip.conf" in run and "PIP_CONFIG_FILE=/run/secrets/pip.conf" in run


def test_build_context_holds_every_package_and_only_what_the_install_reads():
    allowed, _ = _context_entries()
    for name in allowed:
        assert (REPO / name).exists(), f".dockerignore lets in {name}, which does not exist"
    pyproject = (REPO / "pyproject.toml").read_text()
    include = re.search(r"include = \[([^\]]*)\]", pyproject).group(1)
    packages = [name.strip().strip('"').rstrip("*") for name in include.split(",") if name.strip()]
    assert packages and set(packages) <= set(allowed)
    copy_to, install = _install_step()
    assert install == ["install", "-c", "constraints.txt", "."]
    run = next(rest for word, rest in _instructions() if word == "RUN" and "pip install" in rest)
    assert f"cd {copy_to} && pip install" in run
    assert {"pyproject.toml", "constraints.txt", "README.md"} <= set(allowed)
    for heavy in ("tests", "benchmarks", "docs", ".git", ".venv"):
        assert heavy not in allowed


# -- scripts/image_pip_config.py (fast) -------------------------------------------------

def test_pip_config_reads_what_pip_reports_environment_first(tmp_path, monkeypatch):
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://files.example/simple\nconstraint = /nowhere.txt\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.example/simple")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "77")
    found = image_pip_config.pip_config(sys.executable)
    assert found["index-url"] == "https://env.example/simple"
    assert found["timeout"] == "77"
    assert found["constraint"] == "/nowhere.txt"


def test_pip_build_config_serves_local_indexes_and_passes_the_cert(tmp_path):
    index = tmp_path / "mirror" / "simple"
    (index / "demo").mkdir(parents=True)
    (index / "demo" / "index.html").write_text('<a href="../../files/demo-1.0-py3-none-any.whl">demo</a>')
    (tmp_path / "mirror" / "files").mkdir()
    (tmp_path / "mirror" / "files" / "demo-1.0-py3-none-any.whl").write_bytes(b"wheel bytes")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "x-1.0-py3-none-any.whl").write_bytes(b"x")
    cert = tmp_path / "ca.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    out = tmp_path / "out"
    out.mkdir()
    options = {"index-url": "https://pypi.example/simple", "extra-index-url": f"file://{index} {tmp_path}/missing",
               "find-links": str(wheels), "cert": str(cert), "constraint": "/etc/x.txt", "timeout": "60"}
    lines, servers = image_pip_config.build_config(options, out)
    try:
        conf = dict(line.split(" = ", 1) for line in lines[1:])
        assert lines[0] == "[global]"
        assert conf["index-url"] == "https://pypi.example/simple"
        assert "constraint" not in conf and conf["timeout"] == "60"
        assert conf["cert"] == "/run/secrets/pip-cert"
        assert (out / "pip-cert").read_text() == cert.read_text()
        extra = conf["extra-index-url"].split()
        assert len(extra) == 1 and extra[0].startswith("http://127.0.0.1:") and extra[0].endswith("/simple/")
        # The index page and the file it links (relative, outside simple/) are both served.
        with urllib.request.urlopen(extra[0] + "demo/", timeout=5) as resp:
            page = resp.read().decode()
        href = re.search(r'href="([^"]+)"', page).group(1)
        with urllib.request.urlopen(urllib.request.urljoin(extra[0] + "demo/", href), timeout=5) as resp:
            assert resp.read() == b"wheel bytes"
        with urllib.request.urlopen(conf["find-links"], timeout=5) as resp:
            assert "x-1.0-py3-none-any.whl" in resp.read().decode()
        assert all(s.server_address[0] == "127.0.0.1" for s in servers)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
