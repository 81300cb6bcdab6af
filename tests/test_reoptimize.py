"""`sticksat reoptimize` on both store backends: improves (or proves optimal) a stored
benchmark graph whose online plan had a gap, and /compile then serves the improvement;
never stores a slower or an invalid plan; a rerun with the same budget processes nothing
twice; the Dask engine gives the same results as the local one. The SIGKILL test is in
tests/test_reoptimize_kill.py."""
import json
from dataclasses import replace
from pathlib import Path

import pytest

from service.batch import reoptimize as reopt
from service.batch.inventory import add_graphs, compile_into_store
from service.store import ProgramStore
from test_store_backends import store_url  # noqa: F401 - the fixture

TINY = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs" / "tiny"


def _seed(url, names, online=("gpt2_tiny_block16",)):
    """A store holding `names`; the graphs in `online` have an online plan under /compile's
    default key made by the heuristic (a plan with a gap: CP-SAT beats it on
    llama_tiny_decode32)."""
    store = ProgramStore(url)
    added = add_graphs(store, [str(TINY / f"{n}.json") for n in names])
    hashes = {r["name"]: r["graph_hash"] for r in added}
    rows = {n: compile_into_store(store, hashes[n], planner="heuristic", as_default=True) for n in online}
    return store, hashes, rows


def test_improves_a_stored_plan_with_a_gap_and_compile_serves_it(store_url):
    store, hashes, rows = _seed(store_url, ["llama_tiny_decode32", "linear_tiny_m16_k64_n128"],
                                online=("llama_tiny_decode32",))
    before = rows["llama_tiny_decode32"]
    assert before.stats["planner"] == "heuristic" and before.complete
    # deterministic mode: the same plan on a loaded machine as on an idle one (whole-budget
    # CP-SAT from the heuristic hint: 6.49 -> 5.63 us in 2 s)
    summary = reopt.reoptimize(store_url, budget_s=2.0, engine="inline", deterministic=True)
    by_name = {r.name: r for r in summary.rows}
    llama = by_name["llama_tiny_decode32"]
    assert llama.outcome == "improved", llama
    assert llama.after_us < llama.before_us == pytest.approx(before.stats["simulated_us"])
    assert by_name["linear_tiny_m16_k64_n128"].outcome == "new"
    assert by_name["linear_tiny_m16_k64_n128"].solver_status == "OPTIMAL"
    assert summary.totals()["saved_us"] == pytest.approx(llama.before_us - llama.after_us)
    stored = store.get_program(before.key)
    assert stored.stats["simulated_us"] == pytest.approx(llama.after_us) and stored.complete
    assert stored.stats["reoptimized"]["budget_s"] == 2.0 and stored.stats["reoptimized"]["hint"] == "current"
    from service.batch.inventory import list_store

    listed = {r["name"]: r for r in list_store(store)}["llama_tiny_decode32"]
    assert listed["simulated_us"] == pytest.approx(llama.after_us) and listed["planner"] == "cpsat"
    assert listed["reoptimized"]["run_id"] == summary.run_id

    # /compile with default options answers from the store with the re-optimized program
    from fastapi.testclient import TestClient

    from service.http import ServiceConfig, create_app

    document = json.loads((TINY / "llama_tiny_decode32.json").read_text())
    with TestClient(create_app(ServiceConfig(store_path=store_url, workers=1))) as client:
        resp = client.post("/compile", json={"graph": document})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["cached"] is True and body["key"] == before.key
    assert body["stats"]["simulated_us"] == pytest.approx(llama.after_us)
    assert body["stats"]["planner"] == "cpsat"

    # a rerun with the same budget: nothing is processed again; the proven-optimal graph
    # is not even considered
    again = {r.name: r.outcome for r in reopt.reoptimize(store_url, budget_s=2.0, engine="inline").rows}
    assert again == {"llama_tiny_decode32": "skipped:done", "linear_tiny_m16_k64_n128": "skipped:optimal"}
    assert len(store.reoptimizations()) == 2
    assert store.integrity_errors() == []


def test_never_stores_a_slower_or_an_invalid_plan(store_url):
    store, hashes, rows = _seed(store_url, ["gpt2_tiny_block16", "llama_tiny_decode32"],
                                online=("gpt2_tiny_block16", "llama_tiny_decode32"))
    held = {n: (r.program, r.stats["simulated_us"]) for n, r in rows.items()}

    def slower_or_invalid(task):
        result = reopt.solve_task(replace(task, planner="naive", hint=None))  # a valid but slower plan
        assert result.status == "ok"
        if task.name == "llama_tiny_decode32":
            # a worker that returns an invalid program claiming to be very fast: one op's
            # tensor is gone from the declarations
            program = json.loads(result.program)
            program["tensors"] = program["tensors"][1:]
            result.program = json.dumps(program)
            result.stats["simulated_us"] = 0.001
            result.stats["solver_status"] = "OPTIMAL"
        return result

    summary = reopt.reoptimize(store_url, budget_s=1.0, engine="inline", solve=slower_or_invalid)
    by_name = {r.name: r for r in summary.rows}
    assert by_name["gpt2_tiny_block16"].outcome == "unchanged"
    assert by_name["gpt2_tiny_block16"].after_us > by_name["gpt2_tiny_block16"].before_us
    assert by_name["llama_tiny_decode32"].outcome == "failed"
    assert by_name["llama_tiny_decode32"].error.startswith("program fails validation")
    for name, (program, sim) in held.items():
        stored = store.get_program(rows[name].key)
        assert stored.program == program and stored.stats["simulated_us"] == sim


def test_a_result_that_lies_about_its_time_is_retimed(tmp_path):
    """The worker's stats are not trusted: the simulator times the program again."""
    url = str(tmp_path / "s.sqlite")
    store, hashes, rows = _seed(url, ["gpt2_tiny_block16"])

    def lying(task):
        result = reopt.solve_task(replace(task, planner="naive", hint=None))
        result.stats["simulated_us"] = 0.001
        return result

    summary = reopt.reoptimize(url, budget_s=1.0, engine="inline", solve=lying)
    assert summary.rows[0].outcome == "unchanged" and summary.rows[0].after_us > 1.0
    assert store.get_program(rows["gpt2_tiny_block16"].key).stats["planner"] == "heuristic"


def test_only_stale_and_older_compiler_rows(tmp_path, monkeypatch):
    """--only-stale re-solves only graphs without a plan of this compiler and hardware; a
    plan of an older compiler version is the warm start of the new one."""
    url = str(tmp_path / "s.sqlite")
    store, hashes, rows = _seed(url, ["gpt2_tiny_block16", "linear_tiny_m16_k64_n128"])
    # pretend the linear graph was solved by an older compiler: its only row has another key
    old = compile_into_store(store, hashes["linear_tiny_m16_k64_n128"], planner="heuristic")
    store._execute("UPDATE programs SET compiler_version = '0.0.1', key = ? WHERE key = ?", ("old-" + old.key,
                                                                                            old.key))
    summary = reopt.reoptimize(url, budget_s=1.0, engine="inline", only_stale=True)
    by_name = {r.name: r.outcome for r in summary.rows}
    assert by_name == {"gpt2_tiny_block16": "skipped:current", "linear_tiny_m16_k64_n128": "new"}
    (done,) = store.reoptimizations()
    assert done.graph_hash == hashes["linear_tiny_m16_k64_n128"]
    new_rows = [p for p in store.programs_for_graph(done.graph_hash) if p.compiler_version != "0.0.1"]
    assert new_rows[0].stats["reoptimized"]["hint"] == "older"


def test_dask_engine_gives_the_same_results_as_local(store_url, tmp_path, capsys):
    """Deterministic mode, so both engines must find the same plans. The Dask run goes
    through the CLI (`--engine dask --scheduler tcp://...`) to an in-process LocalCluster
    (one worker, one thread) listening on TCP."""
    distributed = pytest.importorskip("distributed")
    from service.cli import main

    names = ["gpt2_tiny_block16", "bmm_tiny_b4_m32_k64_n32"]
    local_url = str(tmp_path / "local.sqlite")
    _seed(local_url, names)
    _seed(store_url, names)
    local = reopt.reoptimize(local_url, budget_s=1.0, engine="local", jobs=1, deterministic=True)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://",
                                  host="127.0.0.1", dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        capsys.readouterr()
        assert main(["reoptimize", "--store", store_url, "--time-limit", "1", "--deterministic", "--engine", "dask",
                     "--scheduler", cluster.scheduler_address, "--json"]) == 0
    dask = json.loads(capsys.readouterr().out)
    assert dask["engine"] == "dask" and dask["budget_s"] == 1.0
    outcome = {r.name: (r.outcome, r.after_us, r.stored_us) for r in local.rows}
    assert {r["name"]: (r["outcome"], r["after_us"], r["stored_us"]) for r in dask["rows"]} == outcome
    assert {o for o, _, _ in outcome.values()} <= {"improved", "proved", "new", "unchanged"}
    assert all(after is not None for _, after, _ in outcome.values())  # both engines made a plan per graph
    assert ProgramStore(store_url).integrity_errors() == []
