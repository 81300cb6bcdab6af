"""Issue 17: progress events of plan() (solver.events) arrive in order and end with the
final status; a sink never changes or breaks a plan."""
import json
import logging

from lowering import lower_document
from lowering.validate import parse_document, validate_document
from solver.events import PHASES, Finished, event_fields, log_sink
from solver.planners import PlannerFailed, plan

from tests.test_cli_compile_simulate import DOC


def _pg():
    doc = parse_document(json.dumps(DOC).encode())
    validate_document(doc)
    return lower_document(doc)


def test_cpsat_events_in_order_and_end_with_final_status():
    got = []
    program = plan(_pg(), planner="cpsat", time_limit_s=2, deterministic=True, events=got.append)
    kinds = [e.kind for e in got]
    assert kinds[-1] == "finished" and kinds.count("finished") == 1
    fin = got[-1]
    assert isinstance(fin, Finished)
    assert fin.status == program.stats.solver_status and fin.predicted_us == program.stats.predicted_us
    # every phase starts before it finishes, phases never interleave, and they follow PHASES order
    open_, seen = None, []
    for e in got:
        if e.kind == "phase_started":
            assert open_ is None
            open_ = e.phase
            seen.append(e.phase)
        elif e.kind == "phase_finished":
            assert open_ == e.phase and e.seconds >= 0
            open_ = None
    assert open_ is None
    assert {"hint", "strategies", "solve", "validation"} <= set(seen)
    assert [PHASES.index(p) for p in seen] == sorted(PHASES.index(p) for p in seen)
    # incumbents only inside the solve phase, each one no worse than the one before
    incs = [e for e in got if e.kind == "incumbent"]
    for e in incs:
        i = got.index(e)
        assert any(g.kind == "phase_started" and g.phase == "solve" for g in got[:i])
    objs = [e.objective_us for e in incs if e.objective_us is not None]
    assert objs == sorted(objs, reverse=True)
    times = [e.t for e in got]
    assert times == sorted(times)


def test_sink_does_not_change_the_plan_and_a_failing_sink_is_ignored():
    pg = _pg()
    a = plan(pg, planner="cpsat", time_limit_s=2, deterministic=True)

    def bad(_e):
        raise RuntimeError("sink bug")

    b = plan(pg, planner="cpsat", time_limit_s=2, deterministic=True, events=bad)
    strip = lambda p: [(o.id, o.core_split, o.temporal_tiles, o.bundle) for o in p.ops]
    assert strip(a) == strip(b)


def test_plain_planner_and_failure_events(monkeypatch):
    got = []
    plan(_pg(), planner="naive", events=got.append)
    assert [e.kind for e in got][0] == "phase_started" and got[-1].kind == "finished"
    assert got[-1].planner == "naive"

    from solver import planners

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setitem(planners.PLANNERS, "broken", broken)
    got = []
    try:
        plan(_pg(), planner="broken", fallback=False, events=got.append)
    except PlannerFailed:
        pass
    assert got[-1].kind == "failed" and "boom" in got[-1].reason
    got = []
    plan(_pg(), planner="broken", fallback=True, events=got.append)
    kinds = [e.kind for e in got]
    assert "fallback" in kinds and kinds[-1] == "finished" and got[-1].planner == "naive"


def test_log_sink_structured_lines(caplog):
    with caplog.at_level(logging.INFO, logger="sticksat"):
        plan(_pg(), planner="naive", events=log_sink(graph="linear_relu"))
    recs = [r for r in caplog.records if r.getMessage() == "plan_progress"]
    assert recs and recs[-1].fields["kind"] == "finished" and recs[-1].fields["graph"] == "linear_relu"
    assert event_fields(Finished("x", None, 1.0, None, None, None))["kind"] == "finished"
