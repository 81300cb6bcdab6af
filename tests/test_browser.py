"""Issue 17: the service's pages in a real browser. A real `sticksat serve` on 127.0.0.1
(temporary store, bearer token set) compiles a layer graph (gpt2_block512, heuristic
planner) and a graph with a hostile name; headless Chromium (Debian's package;
`.ci/setup/chromium.sh` installs it and exports STICKSAT_CHROMIUM) loads the store index,
follows its link to the layer graph's report, and the test checks the DOM the browser
built (table rows, the per-op times against the total, SVG plot elements with a rendered
size, the hostile name shown as text, no script or img elements), that nothing was logged to
the console (console API, uncaught exceptions, the browser's log: failed loads, CSP
violations), and saves a screenshot of each page into the test artifacts
(STICKSAT_TEST_ARTIFACTS, default test-artifacts/ in the checkout).

The browser is driven over the Chrome DevTools Protocol on a pipe
(`--remote-debugging-pipe`: JSON messages separated by NUL on fds 3 and 4), so the test
needs no driver binary and no Python package beyond the standard library. The token
reaches the browser the way docs/report.md tells a user to do it: a client that adds the
Authorization header (here CDP's Network.setExtraHTTPHeaders); without it the pages are
401 like every other route."""
from __future__ import annotations

import base64
import json
import os
import secrets
import select
import shutil
import struct
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest

from service_helpers import ServiceProcess, chain_graph

REPO = Path(__file__).resolve().parent.parent
LAYER = REPO / "benchmarks/graphs/layers/gpt2_block512.json"
EVIL = """<script>alert(1)</script><img src=x onerror="alert(2)">&amp; 'q'"""
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-pipe"]


def _chromium() -> Optional[str]:
    given = os.environ.get("STICKSAT_CHROMIUM")
    if given:
        return given if os.access(given, os.X_OK) else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


CHROMIUM = _chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no headless Chromium: STICKSAT_CHROMIUM is unset or not executable and none is on PATH "
           "(.ci/setup/chromium.sh installs Debian's chromium; locally: apt-get install chromium)")


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe; one page."""

    def __init__(self, binary: str, profile: Path, width: int = 1280, height: int = 900):
        to_chrome_r, self._w = os.pipe()      # we write commands, Chromium reads them on fd 3
        self._r, from_chrome_w = os.pipe()    # Chromium writes replies and events on fd 4
        # bash puts the pipe ends on fds 3 and 4, where --remote-debugging-pipe wants them
        # (bash, not sh: dash takes no fd number above 9 in a redirection).
        self.proc = subprocess.Popen(
            [shutil.which("bash") or "/bin/bash", "-c", f'exec "$0" "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}', binary, *FLAGS,
             f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
            pass_fds=(to_chrome_r, from_chrome_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(profile.parent / "chromium.log", "wb"))
        self.log_path = profile.parent / "chromium.log"
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.session: Optional[str] = None
        self.width = width

    # -- protocol ----------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("no message from Chromium in time")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError(self._died("closed the pipe"))
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: Optional[dict] = None, *, session: bool = True,
             timeout: float = 60.0) -> dict:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        try:
            os.write(self._w, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError:
            raise RuntimeError(self._died(f"is gone before {method}")) from None
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _died(self, what: str) -> str:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        return f"Chromium {what} (exit {self.proc.poll()}); its stderr:\n{tail}"

    def wait_event(self, method: str, since: int, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for ev in self.events[since:]:
                if ev.get("method") == method and ev.get("sessionId") == self.session:
                    return ev
            self.events.append(self._read_message(deadline))

    # -- a page ------------------------------------------------------------------------
    def open_page(self, headers: dict[str, str]) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send("Network.setExtraHTTPHeaders", {"headers": headers})

    def goto(self, url: str) -> None:
        mark = len(self.events)
        nav = self.send("Page.navigate", {"url": url})
        assert not nav.get("errorText"), nav
        self.wait_event("Page.loadEventFired", mark)

    def evaluate(self, expression: str) -> Any:
        out = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        assert "exceptionDetails" not in out, out
        return out["result"].get("value")

    def screenshot(self, path: Path) -> bytes:
        height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)"))
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": min(max(height, 600), 6000), "deviceScaleFactor": 1,
                   "mobile": False})
        png = base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])
        path.write_bytes(png)
        return png

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and the browser's own error log
        (failed loads, CSP violations) of the page so far."""
        out = []
        for ev in self.events:
            method, p = ev.get("method"), ev.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                              for a in p.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                e = p["entry"]
                out.append(f"log {e.get('source')}/{e.get('level')}: {e.get('text')} {e.get('url', '')}")
        return out

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False, timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


def _artifacts() -> Path:
    out = Path(os.environ.get("STICKSAT_TEST_ARTIFACTS") or REPO / "test-artifacts")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


TOKEN = secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The service with a token, and the store holding the layer graph's program."""
    base = tmp_path_factory.mktemp("browser")
    proc = ServiceProcess(base / "store.sqlite", base / "server.log", ["--workers", "1"],
                          env=dict(os.environ, STICKSAT_TOKEN=TOKEN))
    proc.start()
    try:
        layer = httpx.post(proc.url + "/compile", headers=AUTH, timeout=300,
                           json={"graph": json.loads(LAYER.read_text()), "options": {"planner": "heuristic"}})
        assert layer.status_code == 200, layer.text
        evil = httpx.post(proc.url + "/compile", headers=AUTH, timeout=300,
                          json={"graph": chain_graph(rows=64, n_ops=2, name=EVIL), "options": {"planner": "naive"}})
        assert evil.status_code == 200, evil.text
        yield proc, layer.json(), evil.json()
    finally:
        proc.stop()


@pytest.fixture()
def browser(tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()
    b = Browser(CHROMIUM, profile)
    try:
        b.open_page(AUTH)
        yield b
    finally:
        b.close()
        if b.problems():
            print("browser log:", *b.problems(), sep="\n  ")


def test_without_the_token_the_pages_are_401(served):
    proc, layer, _ = served
    for path in ("/", f"/programs/{layer['key']}/report"):
        resp = httpx.get(proc.url + path, timeout=30)
        assert resp.status_code == 401 and resp.headers["content-type"].startswith("application/problem+json")


def test_index_and_report_render_in_headless_chromium(served, browser):
    proc, layer, evil = served
    art = _artifacts()

    browser.goto(proc.url + "/")
    index = browser.evaluate("""(() => ({
        title: document.title,
        graphs: [...document.querySelectorAll('#graphs tbody tr')].map(r => ({
            hash: r.dataset.graph, name: r.cells[0].textContent,
            report: r.querySelector('a') && r.querySelector('a').href})),
        programs: document.querySelectorAll('#programs tbody tr').length,
        scripts: document.scripts.length + document.images.length,
    }))()""")
    assert index["title"] == "sticksat store" and index["scripts"] == 0
    by_hash = {g["hash"]: g for g in index["graphs"]}
    assert set(by_hash) == {layer["graph_hash"], evil["graph_hash"]} and index["programs"] == 2
    assert by_hash[evil["graph_hash"]]["name"] == EVIL                # shown as text, not run
    assert by_hash[layer["graph_hash"]]["name"] == "gpt2_block512"
    report_url = by_hash[layer["graph_hash"]]["report"]
    assert report_url == f"{proc.url}/programs/{layer['key']}/report"
    index_png = browser.screenshot(art / "browser-index.png")
    assert _png_size(index_png)[0] == 1280

    browser.goto(report_url)                       # the link the index gave, resolved by the browser
    dom = browser.evaluate("""(() => {
        const rows = [...document.querySelectorAll('#ops tbody tr')];
        const box = id => { const e = document.getElementById(id); if (!e) return null;
                            const r = e.getBoundingClientRect(); return [r.width, r.height]; };
        return {
            h1: document.querySelector('h1').textContent,
            ops: rows.map(r => r.dataset.op),
            times: rows.map(r => Number(r.dataset.us)),
            total: Number(document.getElementById('summary').dataset.totalUs),
            cells: rows.length ? rows[0].cells.length : 0,
            timelineRects: document.querySelectorAll('#timeline rect').length,
            rooflineDots: document.querySelectorAll('#roofline circle').length,
            roofLine: document.querySelectorAll('#roofline polyline').length,
            lxArea: document.querySelectorAll('#lx polygon').length,
            rooflineRows: document.querySelectorAll('#roofline-table tbody tr').length,
            boxes: {timeline: box('timeline'), roofline: box('roofline'), lx: box('lx'), ops: box('ops')},
            scripts: document.scripts.length,
        };
    })()""")
    program_ops = [o["id"] for o in layer["program"]["ops"]]
    assert dom["h1"] == "gpt2_block512" and dom["scripts"] == 0
    assert sorted(dom["ops"]) == sorted(program_ops) and dom["cells"] == 11
    assert dom["total"] == pytest.approx(layer["stats"]["simulated_us"], rel=1e-12)
    assert sum(dom["times"]) == pytest.approx(dom["total"], rel=1e-9)
    assert dom["timelineRects"] >= len(program_ops)       # every op is busy on at least one core
    assert dom["rooflineDots"] > 0 and dom["roofLine"] == 1 and dom["lxArea"] == 1
    assert dom["rooflineRows"] == len(program_ops)
    for name, (w, h) in dom["boxes"].items():              # laid out, not collapsed
        assert w > 300 and h > 100, (name, w, h)
    report_png = browser.screenshot(art / "browser-report-gpt2_block512.png")
    w, h = _png_size(report_png)
    assert w == 1280 and h > 1500 and len(report_png) > 50_000
    print(f"screenshots: {art / 'browser-index.png'} {art / 'browser-report-gpt2_block512.png'}")

    browser.goto(f"{proc.url}/programs/{evil['key']}/report")
    assert browser.evaluate("document.querySelector('h1').textContent") == EVIL
    assert browser.evaluate("document.scripts.length + document.images.length") == 0
    assert browser.problems() == []


def test_the_console_check_sees_errors(served, browser):
    """The no-console-errors check is not vacuous: a page the browser fails to load (an
    unknown key: 404) and a console.error are both reported."""
    proc, _, _ = served
    mark = len(browser.events)
    browser.goto(f"{proc.url}/programs/{'0' * 64}/report")
    browser.wait_event("Log.entryAdded", mark, timeout=30)
    mark = len(browser.events)
    browser.evaluate("console.error('seen')")
    browser.wait_event("Runtime.consoleAPICalled", mark, timeout=30)
    problems = browser.problems()
    assert any("404" in p for p in problems), problems
    assert any("console.error: seen" in p for p in problems), problems
    browser.events.clear()
