"""What the Docker image runs, without a Docker engine: replay the Dockerfile's COPY and
`pip install -c constraints.txt .` steps into a clean virtualenv (no torch), then run
`sticksat serve` and `sticksat compile` from it.

Slow (a fresh venv and a pip install; pip's cache is reused between runs) and needs
PyPI (or a populated pip cache)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service_helpers import ServiceProcess, chain_graph

REPO = Path(__file__).resolve().parent.parent
PIP_CACHE = Path(os.environ.get("STICKSAT_TEST_PIP_CACHE", Path.home() / ".cache" / "sticksat-test-pip"))

pytestmark = pytest.mark.slow


def _dockerfile_steps() -> tuple[list[tuple[list[str], str]], list[str]]:
    """(COPY sources → destination) pairs before the install, and the pip install argv."""
    copies, install = [], None
    text = (REPO / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)  # join continuation lines
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "COPY" and install is None:
            assert not any(w.startswith("--") for w in words[1:]), "COPY flags are not replayed here"
            copies.append((words[1:-1], words[-1]))
        elif words[0] == "RUN" and "pip" in words and "install" in words and install is None:
            command = line.split("RUN", 1)[1].split("&&")[0].split()
            install = command[command.index("pip") + 1:]
    assert copies and install, "the Dockerfile must COPY the sources and pip install them"
    return copies, install


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
    copies, install = _dockerfile_steps()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for sources, dest in copies:
        # Docker's COPY: a directory's contents go into dest; files go into dest when it
        # is a directory (trailing slash or several sources), else become dest.
        into_dir = dest.endswith("/") or len(sources) > 1
        target = (src / dest).resolve()
        for name in sources:
            path = REPO / name
            if path.is_dir():
                shutil.copytree(path, target, ignore=ignore, dirs_exist_ok=True)
            elif into_dir:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    venv = base / "venv"
    # Build the venv from the interpreter the test runs on, without its site-packages.
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
    env = _clean_env(venv)
    result = subprocess.run([str(venv / "bin" / "pip"), *install], cwd=src, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return venv


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
