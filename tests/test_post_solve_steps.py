"""Adding a post-solve step the way docs/planner.md says: a class with a name, a budget
share, a reserve, `min_trials`, `applies(state)` and `run(state)`, put into
`solver.spyre.steps.POST_SOLVE_STEPS`. The runner (not the step) keeps the step's plan only
when it is valid and simulates faster, and records the step's seconds and gain."""
from dataclasses import replace

import pytest

import tests.primgraphs as primgraphs
from target.hardware import load_target
from solver.baseline.passes import plan_heuristic
from solver.events import StepFinished
from solver.naive import plan_naive
from solver.oracle import checked_program, simulated_us
from solver.plan import Residency
from solver.spyre import steps
from solver.spyre.cpsat_planner import plan_cpsat
from solver.spyre.post_solve import Outcome, PostSolveState

HW = load_target()


class TryHeuristicPlan:
    """An example step: one variant, the heuristic planner's plan of the whole graph."""

    name = "try the heuristic plan"
    share = 1.0        # it may use all the time left when it starts
    reserve = 0.0      # it asks earlier steps to keep nothing for it
    min_trials = 1     # it starts only when one whole-plan trial still fits

    def applies(self, state: PostSolveState) -> bool:
        return True

    def run(self, state: PostSolveState):
        d = plan_heuristic(state.pg, state.hw)
        us = simulated_us(state.pg, state.hw, d)
        if us is None:
            return None
        return Outcome(d, us, notes=[f"heuristic plan: simulated {us:.1f} us"])


class ClaimsAnInvalidPlan:
    """A broken step: a plan with an LX residency past the end of LX, claimed to take 0 us."""

    name = "invalid claim"
    share = 1.0
    reserve = 0.0
    min_trials = 0

    def applies(self, state: PostSolveState) -> bool:
        return True

    def run(self, state: PostSolveState):
        t = state.pg.ops[0].output.tensor
        bad = replace(state.decisions, resident={t: Residency(lx_address=state.hw.lx_capacity_bytes)})
        return Outcome(bad, 0.0, notes=["should never be kept"])


def test_the_runner_keeps_a_valid_faster_plan_and_records_its_gain():
    pg, _ = primgraphs.mlp()
    naive = plan_naive(pg, HW)
    naive_us, heur_us = simulated_us(pg, HW, naive), simulated_us(pg, HW, plan_heuristic(pg, HW))
    assert heur_us < naive_us
    events = []
    state = steps.post_solve(pg, HW, naive, deadline=None, strategies={}, fuse=False,
                             steps=(TryHeuristicPlan(),), events=events.append)
    (record,) = state.records
    assert record.name == "try the heuristic plan" and record.status == "accepted"
    assert record.before_us == naive_us and record.after_us == heur_us
    assert record.gain_us == pytest.approx(naive_us - heur_us) and record.seconds > 0
    assert state.us == heur_us and state.gain_ns() == pytest.approx((naive_us - heur_us) * 1000.0)
    assert state.decisions.planner == "heuristic" and f"heuristic plan: simulated {heur_us:.1f} us" in state.notes
    # and a progress event per step that ran, from the runner
    (event,) = events
    assert isinstance(event, StepFinished) and (event.step, event.status) == ("try the heuristic plan", "accepted")
    assert event.gain_us == record.gain_us and event.seconds == record.seconds


def test_the_runner_rejects_a_plan_that_is_not_faster_or_not_valid():
    pg, _ = primgraphs.mlp()
    heur = plan_heuristic(pg, HW)
    # the same plan again is not faster: kept as it was, no gain
    state = steps.post_solve(pg, HW, heur, deadline=None, strategies={}, fuse=False, steps=(TryHeuristicPlan(),))
    assert [r.status for r in state.records] == ["not faster"] and state.gain_ns() == 0.0
    # a plan the validator rejects is never kept, whatever time the step claims for it
    naive = plan_naive(pg, HW)
    t = pg.ops[0].output.tensor
    assert checked_program(pg, HW, replace(naive, resident={t: Residency(lx_address=HW.lx_capacity_bytes)}))[0] is None
    state = steps.post_solve(pg, HW, naive, deadline=None, strategies={}, fuse=False, steps=(ClaimsAnInvalidPlan(),))
    assert [r.status for r in state.records] == ["invalid"]
    assert state.decisions is naive and "should never be kept" not in state.notes


def test_a_step_added_to_the_list_runs_in_the_planner(monkeypatch):
    """The extension point: the step goes into POST_SOLVE_STEPS (here at the end); the
    planner runs it after the solve, and the plan's notes record what it did."""
    pg, _ = primgraphs.softmax()
    monkeypatch.setattr(steps, "POST_SOLVE_STEPS", steps.POST_SOLVE_STEPS + (TryHeuristicPlan(),))
    d = plan_cpsat(pg, HW, deterministic=True, time_limit_s=2)
    line = next(n for n in d.stats["notes"] if n.startswith("post-solve steps:"))
    assert "try the heuristic plan" in line and "fusion search" in line
    # CP-SAT's plan already beats the heuristic's here: the runner did not take it
    assert "try the heuristic plan not faster" in line


class _SeesItsDeadline:
    """A step that only reports the deadline the runner gave it."""

    min_trials = 0

    def __init__(self, name: str, share: float = 1.0, reserve: float = 0.0):
        self.name, self.share, self.reserve, self.seen = name, share, reserve, []

    def applies(self, state: PostSolveState) -> bool:
        return True

    def run(self, state: PostSolveState):
        self.seen.append(state.deadline)
        return None


def test_a_later_steps_reserve_and_a_steps_share_set_its_deadline():
    import time

    pg, _ = primgraphs.mlp()
    first, later, half = _SeesItsDeadline("first"), _SeesItsDeadline("later", reserve=0.25), \
        _SeesItsDeadline("half", share=0.5)
    t0 = time.perf_counter()
    end = t0 + 1000.0
    steps.post_solve(pg, HW, plan_naive(pg, HW), deadline=end, strategies={}, fuse=False,
                     steps=(first, later, half))
    # the first step leaves a quarter of the time left for the later one; the later one may
    # use everything; the last one half of what is left
    assert first.seen[0] == pytest.approx(end - 0.25 * (end - t0), abs=1.0)
    assert later.seen[0] == end
    assert half.seen[0] == pytest.approx(t0 + 0.5 * (end - t0), abs=1.0)
    # past the deadline nothing starts; without one (deterministic) every step gets None
    late = _SeesItsDeadline("late")
    state = steps.post_solve(pg, HW, plan_naive(pg, HW), deadline=t0 - 1.0, strategies={}, fuse=False,
                             steps=(late,))
    assert [r.status for r in state.records] == ["no time"] and late.seen == []
    steps.post_solve(pg, HW, plan_naive(pg, HW), deadline=None, strategies={}, fuse=False, steps=(late,))
    assert late.seen == [None]
