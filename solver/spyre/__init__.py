"""The Spyre front end of the CP-SAT planner (docs/planner.md): the registered entry
(`cpsat_planner`), the depth step (`depth`), the single-graph pipeline (`single`: `start`,
`model`, `local_search`, `solve`, `bundle_repair`), the post-solve steps (`post_solve`,
`steps`: `fusion`, `split_k_hold`, `tile_buffers`, `relayout`), the budget table (`budget`),
the strategy space (`strategies`), cost model (`cost_model`) and op order (`schedule`). The
generic strategy problem it builds on is `solver.core`."""
