"""The planner's budget table (solver/spyre/budget.py) is complete: every share and limit
the module defines has an entry saying where it acts and what it trades, and the reference
page lists each one with its value."""
import re
from pathlib import Path

from solver.spyre import budget

DOC = Path(__file__).resolve().parent.parent / "docs" / "planner.md"


def _constants() -> dict:
    return {k: v for k, v in vars(budget).items() if re.fullmatch(r"[A-Z][A-Z0-9_]+", k) and k != "TABLE"}


def test_every_knob_has_an_entry_and_every_entry_a_knob():
    names = [k.name for k in budget.TABLE]
    assert len(names) == len(set(names))
    assert set(names) == set(_constants())
    for k in budget.TABLE:
        assert k.trades and k.acts_in, k


def test_the_reference_page_lists_every_knob_with_its_value():
    text = DOC.read_text(encoding="utf-8")
    for name, value in _constants().items():
        assert f"| `{name}` | {value!r} |" in text, name


def test_shares_are_shares():
    for name, value in _constants().items():
        if name.endswith("_SHARE"):
            assert 0.0 < value <= 1.0, name
