"""solver/transfer.py: a plan for one size of a graph carried to another size of the same
graph, repaired, emitted and validated; its simulated time against the naive plan of the
new size."""
from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from backend.capture import capture  # noqa: E402
from lowering import lower_document  # noqa: E402
from lowering.graph_format import GraphDocument  # noqa: E402
from simulator.api import simulate  # noqa: E402
from solver.emit import emit_program  # noqa: E402
from solver.naive import plan_naive  # noqa: E402
from solver.spyre.cpsat_planner import plan_cpsat  # noqa: E402
from solver.transfer import structure_mismatch, transfer_plan  # noqa: E402
from target.hardware import load_target  # noqa: E402


class _Block(torch.nn.Module):
    """Attention-free transformer-ish block: norm, up, gelu, down, residual, softmax."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(128)
        self.up = torch.nn.Linear(128, 256)
        self.down = torch.nn.Linear(256, 128)

    def forward(self, x):
        h = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return torch.softmax(h, dim=-1)


def _graph(rows: int):
    torch.manual_seed(0)
    model = _Block().eval().to(torch.float16)
    doc = capture(model, (torch.randn(rows, 128, dtype=torch.float16),), name=f"block{rows}")
    return lower_document(GraphDocument.model_validate(doc))


def _simulated(pg, hw, decisions) -> float:
    result = simulate(emit_program(pg, hw, decisions), hw=hw)
    assert result.valid, [e.message for e in result.errors[:3]]
    return result.simulated_us


def test_transfer_to_other_sizes_validates_and_keeps_the_solvers_choices():
    hw = load_target()
    source = _graph(256)
    planned = plan_cpsat(source, hw, time_limit_s=5, deterministic=True)
    # onto itself: the identity (same decisions, same simulated time)
    same = transfer_plan(planned, source, _graph(256), hw)
    assert same.transferred and not same.repairs
    assert _simulated(source, hw, same.decisions) == _simulated(source, hw, planned)
    for rows in (512, 128, 96):
        target = _graph(rows)
        assert structure_mismatch(source, target) is None
        started = time.perf_counter()
        result = transfer_plan(planned, source, target, hw)
        transfer_seconds = time.perf_counter() - started
        assert result.transferred and transfer_seconds < 2.0
        transferred = _simulated(target, hw, result.decisions)  # emits and validates
        naive = _simulated(target, hw, plan_naive(target, hw))
        print(f"rows {rows}: transferred {transferred:.2f} us in {transfer_seconds:.3f} s, naive {naive:.2f} us, "
              f"{len(result.repairs)} repairs")
        assert transferred < naive  # the transferred plan keeps what the solver found
        assert result.repairs  # every split of the row dim had to follow the new row count


def test_structure_mismatch_is_named():
    hw = load_target()
    source = _graph(64)
    other = capture(torch.nn.Linear(128, 128).eval().to(torch.float16),
                    (torch.randn(64, 128, dtype=torch.float16),), name="linear")
    target = lower_document(GraphDocument.model_validate(other))
    result = transfer_plan(plan_naive(source, hw), source, target, hw)
    assert not result.transferred and "differ" in result.reason
