#!/usr/bin/env bash
# Set everything up in .venv and run the main job on embedded defaults (README command 1).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q -c constraints.txt -e '.[torch,cli]'
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/python -m backend.demo "$@"
