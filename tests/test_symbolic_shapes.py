"""Graphs with symbolic sizes (dynamic=True, mark_dynamic, automatic dynamic) run on the
device: one program per concrete shape, compiled at call time, reused on a repeat; with
declared buckets, padded and cut back (backend/specialize.py)."""
from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

import backend  # noqa: E402
from backend.options import BackendOptionError, BackendOptions  # noqa: E402
from backend.region import forget_compiled_regions  # noqa: E402
from backend.specialize import ShapeSpecializer, input_path, round_up  # noqa: E402
from tests.models import tiny_model  # noqa: E402

OPTIONS = {"planner": "heuristic", "strict": True}


def _fresh():
    torch._dynamo.reset()
    forget_compiled_regions()


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got - want).abs().max().item() / want.abs().max().item()


# The specializers the backend created during a test (to read their counters).
_created: list = []


@pytest.fixture(autouse=True)
def _track_specializers(monkeypatch):
    _created.clear()
    original = ShapeSpecializer.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _created.append(self)

    monkeypatch.setattr(ShapeSpecializer, "__init__", init)


def test_dynamic_true_compiles_once_per_size_and_reuses_on_repeat(caplog):
    _fresh()
    model, _ = tiny_model("gpt2")
    compiled = torch.compile(model, backend="sticksat", dynamic=True, options=OPTIONS)
    g = torch.Generator().manual_seed(1)
    sizes = (6, 9, 13)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="sticksat"), backend.track_coverage() as cov:
        for length in sizes + sizes:
            ids = torch.randint(0, 128, (1, length), generator=g)
            got = compiled(ids).last_hidden_state
            want = model(ids).last_hidden_state
            assert got.shape == (1, length, 64)
            assert _rel_error(got, want) <= 1e-5, length
    # one Dynamo graph, one program per size, each on device in full; the repeats are hits
    (spec,) = _created
    assert spec.compiles == 3 and spec.hits == 3
    assert [g.sizes for g in cov.graphs] == [f"{spec.symbol_names[spec.symbol_positions[0]]}={n}" for n in sizes]
    assert all(g.device_ops == g.total_ops > 0 and g.reason is None for g in cov.graphs)
    assert not [r for r in caplog.records if r.name == "sticksat" and r.levelno >= logging.WARNING]


def test_mark_dynamic_under_dynamic_false_runs_on_device():
    _fresh()
    model, _ = tiny_model("llama")
    compiled = torch.compile(model, backend="sticksat", dynamic=False, options=OPTIONS)
    g = torch.Generator().manual_seed(2)
    sizes = (5, 7, 11)
    with torch.no_grad(), backend.track_coverage() as cov:
        for length in sizes + (7,):
            ids = torch.randint(0, 128, (2, length), generator=g)
            mask = torch.ones(2, length, dtype=torch.long)
            mask[1, -2:] = 0  # a right-padded row
            torch._dynamo.mark_dynamic(ids, 1)
            torch._dynamo.mark_dynamic(mask, 1)
            got = compiled(ids, attention_mask=mask).last_hidden_state
            want = model(ids, attention_mask=mask).last_hidden_state
            assert _rel_error(got, want) <= 1e-5, length
    (spec,) = _created
    assert spec.compiles == 3 and spec.hits == 1
    assert len(cov.graphs) == 3 and cov.device_fraction == 1.0 and not cov.eager_graphs


def test_automatic_dynamic_recompile_is_specialized_not_eager():
    """dynamic=None: the first size compiles statically, the second makes Dynamo recompile
    with symbolic sizes; that graph still runs on the device."""
    _fresh()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    compiled = torch.compile(model, backend="sticksat", options=OPTIONS)
    with torch.no_grad(), backend.track_coverage() as cov:
        for rows in (3, 5, 7):
            x = torch.randn(rows, 8)
            assert _rel_error(compiled(x), model(x)) <= 1e-5
    assert len(cov.graphs) == 3 and cov.device_fraction == 1.0 and not cov.eager_graphs
    assert cov.graphs[0].sizes == "" and cov.graphs[1].sizes and cov.graphs[2].sizes
    assert len(_created) == 1 and _created[0].compiles == 2


def test_symint_used_as_a_value_is_bound():
    """A size that flows into the computation (arange, a view) is bound to its value."""
    _fresh()

    def f(x):
        n = x.shape[0]
        pos = torch.arange(n, dtype=torch.float32).unsqueeze(1)
        return (x + pos).reshape(n * 2, -1).softmax(-1)

    compiled = torch.compile(f, backend="sticksat", dynamic=True, options=OPTIONS)
    with torch.no_grad(), backend.track_coverage() as cov:
        for rows in (3, 4, 3):
            x = torch.randn(rows, 8)
            assert _rel_error(compiled(x), f(x)) <= 1e-5
    assert len(cov.graphs) == 2 and cov.device_fraction == 1.0


def test_buckets_pad_masked_sizes_and_cut_outputs_back():
    _fresh()
    model, _ = tiny_model("llama")
    # transformers' forward is wrapped (`wrapped_func(*args, **kwargs)`): input_ids is the
    # positional argument 1 (0 is the module), the mask a keyword argument
    options = {**OPTIONS, "buckets": {"args.1.1": 8, "attention_mask.1": 8},
               "pad_values": {"args.1": 0, "attention_mask": 0}}
    compiled = torch.compile(model, backend="sticksat", dynamic=True, options=options)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad(), backend.track_coverage() as cov:
        for length in (5, 7, 8, 11):
            ids = torch.randint(0, 128, (2, length), generator=g)
            mask = torch.ones(2, length, dtype=torch.long)
            got = compiled(ids, attention_mask=mask).last_hidden_state
            want = model(ids, attention_mask=mask).last_hidden_state
            assert got.shape == want.shape == (2, length, 64)
            assert _rel_error(got, want) <= 1e-5, length
    (spec,) = _created
    assert spec.compiles == 2 and spec.hits == 2  # buckets 8 (5, 7, 8) and 16 (11)
    assert "padded" in cov.graphs[0].sizes and "5->8" in cov.graphs[0].sizes
    assert cov.device_fraction == 1.0


def test_padding_refused_where_it_cannot_be_cut_back(caplog):
    """A cache that grows by one (output size s + 1) cannot be padded: the padded
    positions would sit before the new entry. Each exact size compiles instead."""
    _fresh()

    def step(cache, new):
        cache = torch.cat([cache, new], dim=1)
        return cache, cache.softmax(1).sum(1)

    options = {**OPTIONS, "buckets": {"cache.1": 8}, "pad_values": {"cache": 0}}
    compiled = torch.compile(step, backend="sticksat", dynamic=False, options=options)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="sticksat"):
        for n in (3, 4, 5):
            cache, new = torch.randn(2, n, 4), torch.randn(2, 1, 4)
            torch._dynamo.mark_dynamic(cache, 1)
            got_cache, got_sum = compiled(cache, new)
            want_cache, want_sum = step(cache, new)
            assert torch.equal(got_cache, want_cache) and _rel_error(got_sum, want_sum) <= 1e-5
    (spec,) = _created
    assert spec.compiles == 3 and not spec.padding.rules
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "padding of size" in warning and "+ 1" in warning


def test_padding_refused_without_a_pad_value(caplog):
    _fresh()
    options = {**OPTIONS, "buckets": {"x.0": 4}}
    compiled = torch.compile(lambda x: x.relu(), backend="sticksat", dynamic=True, options=options)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="sticksat"):
        x = torch.randn(3, 2)
        assert torch.equal(compiled(x), x.relu())
    assert any("has no pad value" in r.getMessage() for r in caplog.records)
    assert _created[0].compiles == 1 and not _created[0].padding.rules


def test_bucket_options_are_validated():
    assert BackendOptions.from_mapping({"buckets": {"x.1": [64, 16]}}, {}).buckets == {"x.1": (16, 64)}
    assert BackendOptions.from_mapping({"pad_values": {"mask": "-1e30"}}, {}).pad_values == {"mask": -1e30}
    for bad in ({"buckets": {"x": 64}}, {"buckets": {"x.1": 0}}, {"buckets": {"x.1": [8, True]}},
                {"buckets": [64]}, {"pad_values": {"x": "zero"}}, {"pad_values": {"x": None}},
                {"pad_values": {"mask": "-inf"}}, {"pad_values": {"mask": float("nan")}}):
        with pytest.raises(BackendOptionError):
            BackendOptions.from_mapping(bad, {})


def test_bucket_helpers():
    assert [round_up(n, 64) for n in (1, 64, 65)] == [64, 64, 128]
    assert [round_up(n, (1, 2, 4, 8)) for n in (1, 3, 8, 9)] == [1, 4, 8, 9]
    assert input_path("L['past_key_value_states'][0][1]") == "past_key_value_states.0.1"
    assert input_path("L['kwargs']['mask']") == "mask"
    assert input_path("L['args'][1]") == "args.1"
    from backend.specialize import _matches

    assert _matches("past_key_value_states.0.1", "past_key_value_states") and _matches("attn_kwargs.mask", "mask")
    assert not _matches("attn_kwargs.mask", "mas") and not _matches("x", "x.1")


def test_specialized_shapes_are_store_hits_through_the_service(tmp_path, monkeypatch):
    """Through the compile service, each specialized shape is an ordinary document: a new
    process (Dynamo reset, no in-process programs) compiling the same shapes is answered
    from the store."""
    from tests.service_helpers import ServiceProcess

    server = ServiceProcess(tmp_path / "store.sqlite", tmp_path / "server.log", ["--workers", "1"])
    server.start()
    try:
        monkeypatch.setenv("STICKSAT_URL", server.url)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)).eval()
        inputs = [torch.randn(rows, 8) for rows in (3, 5)]
        for attempt in range(2):
            _fresh()
            compiled = torch.compile(model, backend="sticksat", dynamic=True, options={"planner": "naive"})
            hits = server.metric("sticksat_cache_hits_total")
            with torch.no_grad():
                for x in inputs:
                    assert _rel_error(compiled(x), model(x)) <= 1e-5
            assert server.metric("sticksat_cache_hits_total") - hits == (0 if attempt == 0 else 2)
    finally:
        server.stop()
