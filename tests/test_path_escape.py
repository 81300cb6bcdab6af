"""Client data never becomes a path, code or a pickle (issue 16).

Where a client-controlled string could reach the filesystem, and what stops it:
- the hardware target of /compile (`options.target`) and of /simulate (`target`, or the
  program's own `hardware` field), and the `hardware` of a stored record the report
  pages load: `service.pipeline.load_hardware` takes only the names of the shipped
  targets (never a path, even to a valid target file) and never calls the loader for
  anything else;
- store keys and graph hashes in URLs (`/programs/{key}`, `/graphs/{hash}`, the report
  page and its `against`): 64 hex digits by pattern, looked up as SQL parameters;
- the store path: only from the operator (`--store`, STICKSAT_STORE); a request field
  naming one is a 422 (strict models, extra fields forbidden);
- graph names: only stored and shown (HTML-escaped by the pages); no file is named
  after one; the /simulate trace goes to a mkstemp file.
The CLI's `-o`, `--trace`, `--html` and `--hardware` paths are the user's own choice.

Poisoned payloads: a pickle, `__reduce__`-style objects, Python and sympy expression
strings in symbolic sizes, export expressions, names and targets, sent to /compile,
/simulate and the CLI: each is refused or treated as inert data, and the command they
carry never runs (its marker file stays absent, in the server's process too).
"""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service import pipeline
from service_helpers import ServiceProcess, chain_graph

REPO = Path(__file__).resolve().parent.parent
SPYRE_FILE = REPO / "simulator" / "targets" / "spyre.json"
NAIVE = {"planner": "naive", "deterministic": True}
HOSTILE_TARGETS = ["../../etc/passwd", "..", "../targets/spyre", "/etc/passwd", str(SPYRE_FILE),
                   "spyre.json", "spyre/../spyre", "./spyre", "~/.ssh/id_rsa", "%2e%2e%2fspyre",
                   "spyre\x00", "C:\\Windows\\win.ini", "targets/spyre"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("escape")
    proc = ServiceProcess(base / "store.sqlite", base / "server.log", ["--workers", "1", "--queue-limit", "4"])
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def program(server):
    resp = httpx.post(server.url + "/compile", json={"graph": chain_graph(rows=64, name="escape"),
                                                     "options": NAIVE}, timeout=120)
    assert resp.status_code == 200
    return resp.json()


@pytest.mark.parametrize("target", HOSTILE_TARGETS)
def test_load_hardware_never_resolves_a_client_string_as_a_path(target, monkeypatch):
    import target.hardware as hardware

    calls = []
    monkeypatch.setattr(hardware, "load_target", lambda *a, **k: calls.append(a))
    pipeline.load_hardware.cache_clear()
    try:
        with pytest.raises(Exception) as info:
            pipeline.load_hardware(target)
        assert getattr(info.value, "code", None) == "unknown_target"
        assert calls == []  # refused before the loader (and the filesystem) is reached
    finally:
        pipeline.load_hardware.cache_clear()


@pytest.mark.parametrize("target", HOSTILE_TARGETS)
def test_compile_and_simulate_refuse_path_targets(server, program, target):
    resp = httpx.post(server.url + "/compile", json={"graph": chain_graph(rows=64, name="escape"),
                                                     "options": {**NAIVE, "target": target}}, timeout=60)
    assert resp.status_code == 422 and resp.json()["code"] in ("schema", "unknown_target"), resp.text
    sim = httpx.post(server.url + "/simulate", json={"program": program["program"], "target": target}, timeout=60)
    assert sim.status_code == 422 and sim.json()["code"] in ("schema", "unknown_target"), sim.text
    # the program's own hardware field is client data too (the request's target unset)
    named = dict(program["program"], hardware=target)
    sim = httpx.post(server.url + "/simulate", json={"program": named}, timeout=60)
    assert sim.status_code == 422 and sim.json()["code"] == "unknown_target", sim.text


@pytest.mark.parametrize("path", [
    "/programs/..%2F..%2Fetc%2Fpasswd", "/programs/../../etc/passwd", "/programs/%2e%2e", "/graphs/..%2Fstore",
    "/programs/" + "0" * 63 + "/", "/programs/" + "A" * 64, "/programs/" + "0" * 64 + "%00",
    "/programs/" + "0" * 64 + "/report?against=..%2F..%2Fetc%2Fpasswd",
])
def test_keys_in_urls_are_hex_digests_only(server, path):
    resp = httpx.get(server.url + path, timeout=30, follow_redirects=True)  # a trailing slash: 307 to no slash
    assert all(str(r.headers["location"]).startswith((server.url, "/")) for r in resp.history)
    assert resp.status_code in (404, 422), (path, resp.status_code, resp.text[:200])
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert "root:" not in resp.text


def test_a_request_cannot_name_the_store(server, tmp_path):
    elsewhere = tmp_path / "other.sqlite"
    for field in ({"store": str(elsewhere)}, {"store_path": str(elsewhere)}):
        resp = httpx.post(server.url + "/compile", json={"graph": chain_graph(rows=64), "options": NAIVE, **field},
                          timeout=30)
        assert resp.status_code == 422 and resp.json()["code"] == "schema"
        resp = httpx.post(server.url + "/compile", json={"graph": chain_graph(rows=64),
                                                         "options": {**NAIVE, **field}}, timeout=30)
        assert resp.status_code == 422 and resp.json()["code"] == "schema"
    assert not elsewhere.exists()


def test_graph_names_are_inert_data(server, tmp_path):
    marker = tmp_path / "name-ran"
    names = [f"$(touch {marker})", f"`touch {marker}`", f"x; touch {marker}", "../../../../tmp/escaped",
             "/etc/passwd", "<script>alert(1)</script>"]
    for i, name in enumerate(names):  # distinct graphs: the name is not part of the hash
        resp = httpx.post(server.url + "/compile", json={"graph": chain_graph(rows=32 * (i + 1), n_ops=3, name=name),
                                                         "options": NAIVE}, timeout=60)
        assert resp.status_code == 200, resp.text
        graph = httpx.get(server.url + f"/graphs/{resp.json()['graph_hash']}").json()
        assert graph["name"] == name
    index = httpx.get(server.url + "/")
    assert index.status_code == 200 and "<script>alert(1)</script>" not in index.text
    assert not marker.exists() and not Path("/tmp/escaped").exists()


class _Poison:
    """Unpickling this runs a command: nothing may ever unpickle a client's bytes."""

    marker = "/tmp/sticksat-poison-never"

    def __reduce__(self):
        return (eval, (f"__import__('os').system('touch {self.marker}')",))


def _poisoned_documents(marker: str) -> list[tuple[str, str, object]]:
    """(name, route, body) of every poisoned payload."""
    code = f"__import__('os').system('touch {marker}')"
    sympy_code = f"Symbol('s0') + __import__('os').system('touch {marker}')"
    out: list[tuple[str, str, object]] = []

    def graph_with(mutate):
        g = chain_graph(rows=64, n_ops=2, name="poison")
        mutate(g)
        return {"graph": g, "options": NAIVE}

    out.append(("pickle_body", "/compile", pickle.dumps(_Poison(), protocol=2)))
    out.append(("pickle_body_simulate", "/simulate", pickle.dumps(_Poison(), protocol=2)))
    out.append(("reduce_object_arg", "/compile", graph_with(lambda g: g["nodes"][0]["args"].append(
        {"__reduce__": ["eval", [code]], "py/reduce": [{"py/function": "builtins.eval"}, {"py/tuple": [code]}]}))))
    out.append(("py_object_graph", "/compile", {"graph": {"py/object": "os.system", "args": [code]},
                                                "options": NAIVE}))
    out.append(("sym_size_python", "/compile", graph_with(
        lambda g: g["inputs"][0]["meta"].update(shape=[{"sym": code}, 64]))))
    out.append(("sym_size_sympy", "/compile", graph_with(
        lambda g: g["inputs"][0]["meta"].update(shape=[{"sym": sympy_code}, 64]))))
    out.append(("sym_arg", "/compile", graph_with(lambda g: g["nodes"][1]["args"].append(
        {"kind": "sym", "sym": code}))))
    out.append(("string_arg", "/compile", graph_with(lambda g: g["nodes"][1]["args"].append(
        {"kind": "str", "value": code}))))
    out.append(("target_code", "/compile", graph_with(lambda g: None) | {"options": {**NAIVE, "target": code}}))
    out.append(("op_target_code", "/compile", graph_with(lambda g: g["nodes"][0].update(target=code))))
    out.append(("export_expr", "/compile", {"export": {
        "graph_module": {"graph": {"inputs": [], "outputs": [], "nodes": [{
            "target": "torch.ops.aten.add.Tensor", "inputs": [{"name": "self", "arg": {"as_sym_int": {
                "as_expr": {"expr_str": sympy_code, "hint": None}}}}], "outputs": [], "metadata": {}}],
            "tensor_values": {}, "sym_int_values": {"s0": {"as_expr": {"expr_str": code}}}},
            "signature": {"input_specs": [], "output_specs": []}, "module_call_graph": []},
        "opset_version": {"aten": 10}, "schema_version": {"major": 8, "minor": 0}}, "options": NAIVE}))
    return out


def test_poisoned_payloads_never_run(server, program, tmp_path):
    marker = tmp_path / "poison-ran"
    for name, route, body in _poisoned_documents(str(marker)):
        if isinstance(body, bytes):
            resp = httpx.post(server.url + route, content=body, headers={"content-type": "application/json"},
                              timeout=60)
        else:
            resp = httpx.post(server.url + route, json=body, timeout=60)
        assert 400 <= resp.status_code < 500, (name, resp.status_code, resp.text[:300])
        assert resp.headers["content-type"].startswith("application/problem+json"), name
    # /simulate: a program whose fields carry code and expressions
    for field, value in (("hardware", f"__import__('os').system('touch {marker}')"),
                         ("graph_name", "$(touch " + str(marker) + ")")):
        poisoned = dict(program["program"], **{field: value})
        resp = httpx.post(server.url + "/simulate", json={"program": poisoned}, timeout=60)
        assert resp.status_code in (200, 422), resp.text[:300]
    assert httpx.get(server.url + "/healthz").status_code == 200
    assert not marker.exists() and not Path(_Poison.marker).exists()


def test_poisoned_documents_through_the_cli(tmp_path):
    marker = tmp_path / "cli-poison-ran"
    ran = []
    for name, route, body in _poisoned_documents(str(marker)):
        if route != "/compile" or isinstance(body, bytes) or "graph" not in body:
            continue
        doc = tmp_path / f"{name}.json"
        doc.write_text(json.dumps(body["graph"]))
        commands = [["validate", str(doc)]]
        if name in ("sym_size_sympy", "string_arg", "reduce_object_arg"):
            commands.append(["compile", str(doc), "--planner", "naive"])
        for command in commands:
            out = subprocess.run([sys.executable, "-m", "service.cli", *command], capture_output=True, text=True,
                                 timeout=120, cwd=str(REPO))
            ran.append((name, command[0], out.returncode))
            assert "Traceback" not in out.stderr, (name, command, out.stderr[-2000:])
    assert ran and not marker.exists()
    pickled = tmp_path / "pickle.json"
    pickled.write_bytes(pickle.dumps(_Poison(), protocol=2))
    out = subprocess.run([sys.executable, "-m", "service.cli", "validate", str(pickled)], capture_output=True,
                         text=True, timeout=120, cwd=str(REPO))
    assert out.returncode != 0 and "not UTF-8" in out.stdout and "Traceback" not in out.stderr
    assert not Path(_Poison.marker).exists()


def test_cli_report_does_not_open_a_path_named_by_the_program(tmp_path, program):
    probe = tmp_path / "probe.json"
    probe.write_text("{}")  # exists: a path lookup would find it and try to parse it as a target
    doc = tmp_path / "prog.json"
    doc.write_text(json.dumps(dict(program["program"], hardware=str(probe))))
    out = subprocess.run([sys.executable, "-m", "service.cli", "report", str(doc), "--json"], capture_output=True,
                         text=True, timeout=120, cwd=str(REPO))
    # refused as no shipped target before any lookup: a path lookup would have opened the
    # probe as a hardware file and failed on its format instead
    assert out.returncode == 2
    assert "no shipped target" in out.stderr and "pass --hardware" in out.stderr
    assert "expected format" not in out.stderr
