"""Client text never reaches an operator's terminal or an XML report as it is (control
characters in `graph.name`, which /compile accepts, through `store list`, `check STORE`
and `check --junit`), and a gzipped graph file is decompressed under the size limit while
it streams (a gzip bomb never grows past the limit)."""
from __future__ import annotations

import gzip
import json
import tracemalloc
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

from lowering.errors import GraphError
from lowering.validate import parse_document
from service.batch.common import printable, read_graph_file, read_limited
from service.cli import main
from service.store import ProgramStore

TINY = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs" / "tiny"
# Clear the screen, set the window title, ring the bell, return to column 0, reverse the
# text direction, a C1 CSI, a zero-width joiner, a NUL, and rich markup.
EVIL = "evil\x1b[2J\x1b]0;pwned\x07\r\u202egnp.exe\x9b31m\u200d\x00[bold red]x[/]"
RAW = ("\x1b", "\x07", "\r", "\u202e", "\x9b", "\u200d", "\x00")


def test_printable_escapes_every_control_and_format_character():
    out = printable(EVIL)
    assert not any(c in out for c in RAW)
    assert out == ("evil\\x1b[2J\\x1b]0;pwned\\x07\\x0d\\u202egnp.exe\\x9b31m\\u200d\\x00[bold red]x[/]")
    assert printable("plain name, ünïcode ✓") == "plain name, ünïcode ✓"
    assert printable("x" * 50, limit=10) == "x" * 10 + "\u2026"


def _evil_store(tmp_path) -> str:
    document = json.loads((TINY / "linear_tiny_m16_k64_n128.json").read_text())
    document["name"] = EVIL
    doc = parse_document(document)  # accepted, as /compile accepts it
    assert doc.name == EVIL
    path = str(tmp_path / "store.sqlite")
    ProgramStore(path).put_graph(doc.graph_hash(), doc.to_json(), doc.name)
    return path


def test_store_list_escapes_graph_names(tmp_path, capsys):
    path = _evil_store(tmp_path)
    assert main(["store", "list", "--store", path]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in RAW)
    assert "\\x1b[2J" in out and "[bold red]" in out  # shown, escaped, not read as markup
    assert main(["store", "list", "--store", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["name"] == EVIL  # JSON carries it exactly (escaped by JSON)


def test_check_of_a_store_escapes_names_in_the_table_and_writes_well_formed_junit(tmp_path, capsys):
    path = _evil_store(tmp_path)
    junit = tmp_path / "check.xml"
    rc = main(["check", path, "--planner", "heuristic", "--junit", str(junit)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    for text in (captured.out, captured.err):
        assert not any(c in text for c in RAW)
    assert "\\x1b[2J" in captured.out
    tree = ET.parse(junit)  # well-formed XML
    [case] = tree.getroot().iter("testcase")
    assert case.get("name") == printable(EVIL)


def test_junit_of_a_failing_case_is_well_formed(tmp_path):
    from service.batch.check import CheckCase, CheckResult, write_junit

    case = CheckCase(name=EVIL, source=f"dir/{EVIL}.json", reason="compile",
                     message=f"invalid graph: dangling_ref: node '{EVIL}'")
    junit = tmp_path / "fail.xml"
    write_junit(str(junit), CheckResult(cases=[case], options={"location": EVIL}))
    root = ET.parse(junit).getroot()
    failure = next(root.iter("failure"))
    assert failure.get("message") == printable(case.message)
    assert json.loads(failure.text)["name"] == EVIL  # the JSON detail keeps the exact text, escaped


def _bomb(path: Path, decompressed_mb: int) -> None:
    """A gzip file of `decompressed_mb` MiB of spaces (valid JSON padding), about 1000:1."""
    comp = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b" " * (1 << 20)
    with open(path, "wb") as f:
        for _ in range(decompressed_mb):
            f.write(comp.compress(block))
        f.write(comp.flush())


def test_a_gzip_bomb_is_refused_at_the_limit_while_streaming(tmp_path):
    bomb = tmp_path / "bomb.json.gz"
    _bomb(bomb, 128)
    assert bomb.stat().st_size < 1 << 20
    limit = 16 << 20
    tracemalloc.start()
    try:
        with pytest.raises(GraphError) as info:
            read_limited(bomb, limit)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.code == "graph_too_large" and str(limit) in info.value.message
    assert peak < 3 * limit, f"peak {peak} bytes while refusing a 128 MiB bomb at {limit}"


def test_store_add_and_check_refuse_a_bomb(tmp_path, capsys):
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    _bomb(graphs / "bomb.json.gz", 80)   # past the 64 MiB document limit
    store = str(tmp_path / "store.sqlite")
    assert main(["store", "add", str(graphs / "bomb.json.gz"), "--store", store, "--json"]) == 1
    [line] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert line["error"]["code"] == "graph_too_large"
    assert main(["check", str(graphs), "--planner", "heuristic", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert "graph_too_large" in result["cases"][0]["message"]


def test_gzipped_graphs_still_read(tmp_path):
    src = TINY / "linear_tiny_m16_k64_n128.json"
    one = tmp_path / "one.json.gz"
    one.write_bytes(gzip.compress(src.read_bytes()))
    assert read_graph_file(one).graph_hash() == parse_document(src.read_bytes()).graph_hash()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(one.read_bytes()[:-20])
    with pytest.raises(GraphError, match="cut short") as info:
        read_graph_file(cut)
    assert info.value.code == "schema"
    plain = tmp_path / "plain.json.gz"
    plain.write_bytes(src.read_bytes())
    with pytest.raises(GraphError, match="not a gzip") as info:
        read_graph_file(plain)


def test_a_file_without_an_end_is_read_only_to_the_limit():
    with pytest.raises(GraphError) as info:
        read_limited("/dev/zero", 1 << 20)   # used to read until memory ran out
    assert info.value.code == "graph_too_large"
