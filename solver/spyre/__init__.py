"""The Spyre front end of the CP-SAT planner: strategy space (`strategies`), cost model
(`cost_model`), the joint model and its solve (`cpsat_planner`), op order (`schedule`), and
the post-solve steps (`fusion`, `tile_buffers`, `relayout`). The generic strategy problem
it builds on is `solver.core`."""
