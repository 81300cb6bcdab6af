"""Batch tools over the program store: `sticksat store add/list` (inventory.py), the CI
gate `sticksat check` (check.py) and `sticksat reoptimize` (reoptimize.py). docs/batch.md."""
