"""Fused coarse-tiled kernels: core splits, temporal tiles and tile buffers for runs of
consecutive compute ops.

The timing model (`target.superdsc.fused_group_key`, `simulator.timing` `close_group`)
runs consecutive compute ops of one bundle with the same temporal tiling (T > 1) on the
same core count as one coarse-tiled fused kernel, as torch-spyre's back end does: each
core loads each box of an external device-memory tensor once, a member's result is on chip
for later members on the same core, loads and compute of all members overlap across the
tile loop, and the loop overhead is paid once. A result only the kernel uses can then be a tile buffer
(`solver.spyre.tile_buffers`): it is never written whole. Against that stand the costs of tiling:
a small per-tile stream underfills, double buffering needs LX room, a working set past the
spill knee derates. Whether a run gains is therefore a question for the simulator itself.

The modules, in the order the search uses them (`search` is the driver, its docstring the
pipeline):
- `search`: `fuse_tiled_groups`, stage 1 (splits), stage 2 (tile counts), the combination,
  then the steps below in sequence;
- `runs`: where a kernel can form and how a run is tiled;
- `variants`: the split alternatives tried per run;
- `split_maps`: a core split carried through a tensor (shared by variants, merges, holds);
- `trial`: one emitted, tile-buffered, timed trial; the validity check;
- `merge`: adjacent runs and sibling matmuls merged into one kernel;
- `revisit`: runs put back on their own fastest choice after a whole trial won;
- `hold`: results handed between kernels held whole in LX (`meet`: both kernels on one split);
- `retile`: kernels that underfill the stream with fewer tiles;
- `resplit`: the re-split start the planner searches first (`resplit_for_tiling`).
"""
from solver.spyre.fusion.resplit import resplit_for_tiling
from solver.spyre.fusion.search import FUSION_TRIALS, TILE_COUNTS, FusionResult, fuse_tiled_groups

__all__ = ["FUSION_TRIALS", "TILE_COUNTS", "FusionResult", "fuse_tiled_groups", "resplit_for_tiling"]
