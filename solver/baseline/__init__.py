"""The yardstick: torch-spyre's compiler passes as published, each pass a module named after
its upstream counterpart (`propagate_layouts`, `work_division`, `scratchpad`), run in
upstream's order by `passes` (the `heuristic` planner). docs/baseline.md."""
