"""The depth step: graphs too deep for one CP-SAT model within their time limit, planned in
pieces by the single-graph planner (`solver.spyre.single.plan_graph`), which sits below this
package and never calls up into it (docs/depth.md).

- `step.plan_whole`: the entry the registered planner calls (None: not taken);
- `repeats`: a repeated block found, one copy solved, its plan copied (`plan_depth`);
- `windows`: what does not repeat, in windows along the op order (`plan_windowed`);
- `segments`: a piece of the graph as a graph of its own, and plans of pieces merged;
- `hint`: the whole graph's hint (its time, the reserve it sets, its check).
"""
from solver.spyre.depth.step import plan_whole

__all__ = ["plan_whole"]
