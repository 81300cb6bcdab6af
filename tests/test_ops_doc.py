"""docs/ops.md's support table is generated from the lowering registry
(scripts/gen_ops_doc.py): it must be current, and generating it must not need torch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gen_ops_doc.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)


def test_docs_ops_table_is_current():
    res = _run("--check")
    assert res.returncode == 0, f"{res.stderr}\ndocs/ops.md is stale: run python scripts/gen_ops_doc.py"


def test_generator_needs_no_torch():
    code = ("import runpy, sys; sys.argv = ['gen_ops_doc.py', '--check']\n"
            f"try:\n    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules, 'the generator imported torch'\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr


def test_check_mode_detects_a_stale_table_and_rewriting_fixes_it(tmp_path):
    doc = tmp_path / "ops.md"
    current = (ROOT / "docs" / "ops.md").read_text()
    stale = current.replace("| conv | `convolution.default` |", "| conv | `convolution.defaultx` |")
    assert stale != current
    doc.write_text(stale)
    assert _run("--check", "--doc", str(doc)).returncode == 1
    assert doc.read_text() == stale  # check mode writes nothing
    assert _run("--doc", str(doc)).returncode == 0
    assert doc.read_text() == current


def test_every_supported_target_is_in_the_table():
    from lowering import SUPPORTED_TARGETS

    table = (ROOT / "docs" / "ops.md").read_text().split("<!-- ops-table:begin -->")[1].split(
        "<!-- ops-table:end -->")[0]
    for target in SUPPORTED_TARGETS:
        assert f"`{target.removeprefix('aten.')}`" in table, target
    for new in ("convolution.default", "clamp_min.Tensor", "clamp_max.Tensor", "clamp.Tensor", "isinf.default"):
        assert f"`{new}`" in table


def test_core_aten_table_lists_exactly_the_core_ops_without_a_lowering():
    """docs/ops.md's "Core ATen coverage" table against torch's core tag and the
    decomposition table (scripts/core_aten_coverage.py)."""
    import runpy

    mod = runpy.run_path(str(ROOT / "scripts" / "core_aten_coverage.py"))
    cov = mod["coverage"]()
    text = (ROOT / "docs" / "ops.md").read_text()
    assert mod["check"](cov, text) == []
    # the check can fail: a supported op listed as unsupported, and a dropped row, are caught
    assert mod["check"](cov, text.replace("| `aten.nonzero.default` |", "| `aten.log1p.default` |"))
    assert len(cov.arrive) > 100 and len(cov.unsupported) < len(cov.arrive) // 5
