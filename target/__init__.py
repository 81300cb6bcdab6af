"""The target: what the device is and what a program for it says.

The bottom layer every other package builds on, importing none of them:
- `primitives`: the primitive loop-nest ops (the vocabulary lowering produces and programs
  carry), and `interpreter`, their numpy reference semantics;
- `op_rules`: which stick dim each operand of a primitive op may take and how an op may be
  split over cores (the layout rules the planner and the validator both obey);
- `hardware`: the hardware description (one JSON file per target under `targets/`), the one
  place machine numbers are read, feeding the planner's cost model and the simulator alike;
- `superdsc`: the SuperDSC program format (what a planner emits and the simulator judges);
- `geometry`: layout and stick arithmetic shared by the emitter, the validator and the
  timing model.
"""
