"""The target: what the device is and what a program for it says.

The bottom layer every other package builds on, importing none of them:
- `primitives`: the primitive loop-nest ops (the vocabulary lowering produces and programs
  carry), and `interpreter`, their numpy reference semantics;
- `op_rules`: which stick dim each operand of a primitive op may take and how an op may be
  split over cores (the layout rules the planner and the validator both obey);
- `hardware`: the hardware description (one JSON file per target under `targets/`), the one
  place machine numbers are read, feeding the planner's cost model and the simulator alike;
- `superdsc`: the SuperDSC program format (what a planner emits and the simulator judges);
- `layout`: a tensor's Spyre device layout (dims order, stick groups, strides, offsets,
  spans, contiguity), the one home of that geometry;
- `geometry`: per-core slices, boxes and tiles over those layouts; both shared by the
  emitter, the validator, the functional run and the timing model.
"""
