"""Issue 17: the service's HTML pages against a real `sticksat serve` on 127.0.0.1: the
report of a stored program (its per-op times sum to the simulated total the service
stored, the JSON it is rendered from agrees), the store index (lists the compiled graph
with its best time and a link to the report), 404/422 problem+json for unknown and
malformed keys, and HTML-escaping of a hostile graph name."""
from __future__ import annotations

import html
import math
from html.parser import HTMLParser

import httpx
import pytest

from service_helpers import ServiceProcess, chain_graph
from simulator.report import fmt_us
from tests.test_cli_compile_simulate import DOC

PROBLEM = "application/problem+json"
EVIL = """<script>alert(1)</script><img src=x onerror="alert(2)">&amp; 'q'"""


class _Page(HTMLParser):
    """Body rows (their attributes) per table id, every link, every tag name, the text of h1."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[dict]] = {}
        self.links: list[str] = []
        self.tags: list[str] = []
        self.attrs_by_id: dict[str, dict] = {}
        self.h1 = ""
        self._table: list[str] = []
        self._in_h1 = False
        self._in_body = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if "id" in a:
            self.attrs_by_id[a["id"]] = a
        if tag == "table":
            self._table.append(a.get("id", ""))
            self.tables.setdefault(a.get("id", ""), [])
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._table and self._in_body:
            self.tables[self._table[-1]].append(a)
        elif tag == "a":
            self.links.append(a.get("href", ""))
        elif tag == "h1":
            self._in_h1 = True

    def handle_endtag(self, tag):
        if tag == "table" and self._table:
            self._table.pop()
        elif tag == "tbody":
            self._in_body = False
        elif tag == "h1":
            self._in_h1 = False

    def handle_data(self, data):
        if self._in_h1:
            self.h1 += data


def _parse(text: str) -> _Page:
    p = _Page()
    p.feed(text)
    return p


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("pages")
    proc = ServiceProcess(base / "store.sqlite", base / "server.log", ["--workers", "1"])
    proc.start()
    yield proc
    proc.stop()


def _compile(server, graph, planner="heuristic") -> dict:
    resp = httpx.post(server.url + "/compile", json={"graph": graph, "options": {"planner": planner}},
                      timeout=180)
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.fixture(scope="module")
def compiled(server):
    return {"linear_relu": _compile(server, DOC),
            "linear_relu_naive": _compile(server, DOC, planner="naive"),
            "evil": _compile(server, chain_graph(rows=48, n_ops=3, name=EVIL), planner="naive")}


def _problem(resp, status, code):
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith(PROBLEM)
    assert resp.json()["code"] == code


def test_report_per_op_times_sum_to_the_stored_simulated_total(server, compiled):
    out = compiled["linear_relu"]
    key = out["key"]
    resp = httpx.get(f"{server.url}/programs/{key}/report", timeout=60)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    assert "script-src" not in resp.headers["content-security-policy"]    # default-src 'none' covers scripts
    assert resp.headers["content-security-policy"].startswith("default-src 'none'")
    page = _parse(resp.text)
    rows = page.tables["ops"]
    assert len(rows) == len(out["program"]["ops"])             # every op of the stored program, none twice
    assert {r["data-op"] for r in rows} == {o["id"] for o in out["program"]["ops"]}
    times = [float(r["data-us"]) for r in rows]
    total = float(page.attrs_by_id["summary"]["data-total-us"])
    stored = out["stats"]["simulated_us"]                        # what the service measured at compile time
    assert total == pytest.approx(stored, rel=1e-12)
    assert math.fsum(times) == pytest.approx(total, rel=1e-9)
    assert times == sorted(times, reverse=True)                  # sorted by simulated time
    assert fmt_us(stored) in resp.text
    # the plots and the other tables are there, nothing is loaded from elsewhere
    assert {"timeline", "roofline", "lx", "roofline-table"} <= set(page.attrs_by_id)
    assert "script" not in page.tags
    assert all(not h.startswith(("http:", "https:", "//")) for h in page.links)
    assert "../../" in page.links                                # back to the index

    js = httpx.get(f"{server.url}/programs/{key}/report", params={"format": "json"}, timeout=60)
    assert js.status_code == 200 and js.headers["content-type"].startswith("application/json")
    body = js.json()
    assert body["key"] == key and body["graph_hash"] == out["graph_hash"]
    rep = body["report"]
    assert rep["total_us"] == pytest.approx(stored, rel=1e-12)
    assert math.fsum(o["simulated_us"] for o in rep["ops"]) == pytest.approx(rep["total_us"], rel=1e-9)
    assert rep["planner"] == out["stats"]["planner"] == "heuristic"
    mm = next(o for o in rep["ops"] if o["opfunc"] == "matmul")
    assert mm["source"] == "mm" and mm["macs"] == 16 * 64 * 96


def test_index_lists_the_compiled_graphs_with_links_to_their_reports(server, compiled):
    resp = httpx.get(server.url + "/", timeout=60)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    page = _parse(resp.text)
    graphs = [r["data-graph"] for r in page.tables["graphs"]]
    assert sorted(graphs) == sorted({c["graph_hash"] for c in compiled.values()})     # one row per graph
    keys = {r["data-key"] for r in page.tables["programs"]}
    assert keys == {c["key"] for c in compiled.values()}
    for c in compiled.values():
        assert f"programs/{c['key']}/report" in page.links
        assert fmt_us(c["stats"]["simulated_us"]) in resp.text     # each program's time, formatted
    # the best program of linear_relu is the faster of its two
    best = min((compiled["linear_relu"], compiled["linear_relu_naive"]), key=lambda c: c["stats"]["simulated_us"])
    row = resp.text.split(f'data-graph="{best["graph_hash"]}"', 1)[1].split("</tr>", 1)[0]
    assert f"programs/{best['key']}/report" in row and fmt_us(best["stats"]["simulated_us"]) in row
    assert "linear_relu" in resp.text and "heuristic" in resp.text and "naive" in resp.text
    assert "2 graphs, 3 programs" in resp.text
    # a link from the index resolves to the report
    link = next(h for h in page.links if compiled["linear_relu"]["key"] in h)
    assert httpx.get(f"{server.url}/{link}", timeout=60).status_code == 200


def test_report_against_another_program_of_the_graph_shows_the_diff(server, compiled):
    a, b, evil = compiled["linear_relu"], compiled["linear_relu_naive"], compiled["evil"]
    url = f"{server.url}/programs/{a['key']}/report"
    page = httpx.get(url, timeout=60).text
    assert f"?against={b['key']}" in _parse(page).links            # the graph's other program, to compare
    resp = httpx.get(url, params={"against": b["key"]}, timeout=60)
    assert resp.status_code == 200
    rows = _parse(resp.text).tables["diff"]
    js = httpx.get(url, params={"against": b["key"], "format": "json"}, timeout=60).json()
    diff = js["diff"]
    assert len(rows) == len(diff["ops"]) > 0                       # heuristic and naive decide differently
    assert diff["this_us"] == pytest.approx(a["stats"]["simulated_us"], rel=1e-12)
    assert diff["other_us"] == pytest.approx(b["stats"]["simulated_us"], rel=1e-12)
    assert diff["delta_us"] == pytest.approx(diff["other_us"] - diff["this_us"], rel=1e-9)
    same = httpx.get(url, params={"against": a["key"], "format": "json"}, timeout=60).json()
    assert same["diff"]["ops"] == []                                # a program against itself: no difference
    assert "no differing decisions" in httpx.get(url, params={"against": a["key"]}, timeout=60).text
    _problem(httpx.get(url, params={"against": evil["key"]}), 422, "different_graphs")
    _problem(httpx.get(url, params={"against": "1" * 64}), 404, "not_found")
    _problem(httpx.get(url, params={"against": "nope"}), 422, "schema")


def test_unknown_key_is_404_and_a_malformed_one_422(server):
    _problem(httpx.get(f"{server.url}/programs/{'0' * 64}/report"), 404, "not_found")
    _problem(httpx.get(f"{server.url}/programs/{'0' * 64}/report", params={"format": "json"}), 404, "not_found")
    _problem(httpx.get(f"{server.url}/programs/not-a-key/report"), 422, "schema")
    _problem(httpx.get(f"{server.url}/programs/{'0' * 64}/report", params={"format": "xml"}), 422, "schema")


def test_graph_names_are_escaped(server, compiled):
    evil = compiled["evil"]
    escaped = html.escape(EVIL)
    assert escaped.startswith("&lt;script&gt;") and "&quot;" in escaped and "&amp;amp;" in escaped
    for path in ("/", f"/programs/{evil['key']}/report"):
        text = httpx.get(server.url + path, timeout=60).text
        assert EVIL not in text and escaped in text, path
        assert "<script" not in text.lower() and "<img" not in text.lower(), path
        assert not {"script", "img"} & set(_parse(text).tags)
    assert _parse(httpx.get(f"{server.url}/programs/{evil['key']}/report", timeout=60).text).h1 == EVIL


def test_pages_are_in_the_openapi_document(server):
    spec = httpx.get(server.url + "/openapi.json", timeout=30).json()
    report = spec["paths"]["/programs/{key}/report"]["get"]["responses"]
    assert {"200", "401", "404", "422"} <= set(report)
    assert "text/html" in report["200"]["content"]
    assert "401" in spec["paths"]["/"]["get"]["responses"]
