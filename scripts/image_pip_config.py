"""The machine's pip configuration, made usable inside `docker build` (BuildKit secrets).

    python3 scripts/image_pip_config.py OUT_DIR [--pip PYTHON]

Reads what `PYTHON -m pip config list` reports on this machine (config files and PIP_*
environment variables) and writes OUT_DIR/pip.conf for the build's RUN step, which
mounts it as the secret `pip.conf`:

- index-url, extra-index-url, find-links, trusted-host, timeout, retries are carried over;
- a `cert` (CA bundle) is copied to OUT_DIR/pip-cert and referred to as
  /run/secrets/pip-cert (mounted as the secret `pip-cert`);
- local indexes and find-links (file:// URLs or paths) do not exist inside the build:
  each is served read-only over HTTP on 127.0.0.1 by this process (the build runs with
  `--network host`) and the config points at that server instead;
- `constraint` is dropped: the image installs with the project's own constraints.txt.

With local directories to serve, the process stays in the foreground serving them until
it is terminated; OUT_DIR/pip.conf is written only once every server is listening, so a
caller waits for the file. Without any, it writes the file and exits. Nothing here is
shipped in the image: secrets are not stored in layers.
"""
from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

CARRIED = ("index-url", "extra-index-url", "find-links", "trusted-host", "timeout", "retries")
ALIASES = {"default-timeout": "timeout"}
SECRET_DIR = "/run/secrets"


def pip_config(python: str) -> dict[str, str]:
    """{option: value} as pip resolves it here; later sources (environment) win."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
    found: dict[str, tuple[int, str]] = {}
    for line in out.splitlines():
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        scope, _, option = key.rpartition(".")
        option = ALIASES.get(option, option)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        # Precedence: environment (":env:") over config files; "global" is the lowest.
        rank = 2 if scope.startswith(":env:") else (0 if scope == "global" else 1)
        if option not in found or rank >= found[option][0]:
            found[option] = (rank, value)
    return {k: v for k, (_, v) in found.items()}


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the stdlib's signature
        pass


def _serve(directory: Path) -> ThreadingHTTPServer:
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _local_path(location: str) -> Path | None:
    if location.startswith("file:"):
        return Path(unquote(urlparse(location).path))
    if "://" not in location:
        return Path(location)
    return None


def build_config(options: dict[str, str], out: Path) -> tuple[list[str], list[ThreadingHTTPServer]]:
    """The pip.conf lines for the build and the servers started for local indexes."""
    servers: list[ThreadingHTTPServer] = []
    by_root: dict[Path, ThreadingHTTPServer] = {}

    def http_for(path: Path, index: bool) -> str | None:
        if not path.exists():
            print(f"image_pip_config: {path} does not exist here, left out", file=sys.stderr)
            return None
        # An index page links its files relative to itself (../../files/...): serve the
        # index directory's parent so those links resolve; a find-links dir as itself.
        root = path.parent if index and path.is_dir() else (path if path.is_dir() else path.parent)
        if root not in by_root:
            by_root[root] = _serve(root)
            servers.append(by_root[root])
        port = by_root[root].server_address[1]
        rel = path.relative_to(root).as_posix()
        return f"http://127.0.0.1:{port}/" + (rel + "/" if rel not in ("", ".") else "")

    lines = ["[global]"]
    for option in CARRIED:
        if option not in options:
            continue
        values = options[option].split()
        if option in ("index-url", "extra-index-url", "find-links"):
            mapped = []
            for value in values:
                local = _local_path(value)
                mapped.append(value if local is None else http_for(local, index=option != "find-links"))
            values = [v for v in mapped if v]
        if values:
            lines.append(f"{option} = " + " ".join(values))
    cert = options.get("cert")
    if cert and Path(cert).is_file():
        shutil.copyfile(cert, out / "pip-cert")
        lines.append(f"cert = {SECRET_DIR}/pip-cert")
    return lines, servers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--pip", default=sys.executable, help="the Python whose pip configuration is read")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    lines, servers = build_config(pip_config(args.pip), args.out)
    tmp = args.out / "pip.conf.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, args.out / "pip.conf")
    for server in servers:
        print(f"image_pip_config: serving {server.RequestHandlerClass.keywords['directory']} "
              f"on 127.0.0.1:{server.server_address[1]}", file=sys.stderr)
    if servers:
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
