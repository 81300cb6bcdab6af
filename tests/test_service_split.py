"""Issue 29, the service split by concern: the compile driver (service.pipeline), the
request preparation (service.prepare) and the pool workers never import the HTTP stack,
and the planners are declared in one registry that the service, the CLI and the
benchmarks read."""
import asyncio
import json
import subprocess
import sys

from service_helpers import chain_graph, loaded_modules

HTTP_STACK = ("fastapi", "starlette", "uvicorn")


def test_the_embedded_compile_path_imports_no_http_stack_and_no_store():
    """What the torch backend's embedded mode runs (backend/region.py: service.pipeline's
    compile_in_process), in a fresh interpreter."""
    code = (
        "import json, sys\n"
        "from service.pipeline import compile_in_process\n"
        f"program = compile_in_process({json.dumps(chain_graph(rows=64))!r}, planner='naive')\n"
        "assert program['ops'], program\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {HTTP_STACK!r} or m == 'service.store')\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_pool_workers_import_no_http_stack():
    """A pool worker that warmed up, prepared a body (what a large /compile does) and ran a
    compile has loaded none of FastAPI, Starlette or uvicorn."""
    from service import pipeline
    from service.pool import SolverPool, wait
    from service.prepare import PreparedCompile, RequestLimits, prepare_compile

    body = json.dumps({"graph": chain_graph(rows=64), "options": {"planner": "naive"}}).encode()
    limits = RequestLimits(pipeline.GraphLimits(), pipeline.MAX_TIME_LIMIT_S, 2**26)

    async def scenario():
        pool = SolverPool(workers=1, queue_limit=2)
        await pool.start(pipeline.warm_worker)
        try:
            fut, _ = pool.submit("prepare", prepare_compile, body, limits, True)
            prepared = await wait(fut, 120)
            assert isinstance(prepared, PreparedCompile) and prepared.document_json
            job = pipeline.CompileJob(document=prepared.document_json, options=prepared.options)
            fut, _ = pool.submit("compile", pipeline.compile_job, job)
            outcome = await wait(fut, 120)
            assert outcome.status == "ok", outcome.error
            fut, _ = pool.submit("modules", loaded_modules, HTTP_STACK)
            return await wait(fut, 60)
        finally:
            pool.shutdown()

    assert asyncio.run(scenario()) == []


def test_one_planner_registry():
    """The service's planners, its preferred and fast fallback planner, the benchmark's
    planner columns and the CLI's help all come from solver.planners.KNOWN_PLANNERS."""
    from benchmarks import suite
    from service import pipeline
    from solver import planners

    online = [i.name for i in planners.KNOWN_PLANNERS if i.online]
    assert pipeline.available_planners() == sorted(online)
    assert pipeline.default_planner() == planners.DEFAULT_PLANNER
    assert pipeline.fallback_planner("cpsat") == "heuristic"  # the first fast planner of the chain
    assert pipeline.fallback_planner("naive") is None
    assert suite.PLANNER_NAMES == tuple(i.name for i in planners.KNOWN_PLANNERS)
    assert set(suite.SEARCH_PLANNERS) == {i.name for i in planners.KNOWN_PLANNERS if i.searches}
    for info in planners.KNOWN_PLANNERS:  # every row names the module that registers it
        planners.ensure_registered(info.name)
        assert info.name in planners.PLANNERS
    help_text = subprocess.run([sys.executable, "-m", "service.cli", "compile", "--help"], capture_output=True,
                               text=True, check=True).stdout
    for info in planners.KNOWN_PLANNERS:
        assert info.name in help_text
