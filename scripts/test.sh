#!/usr/bin/env bash
# Set everything up in .venv and run the whole test suite (README command 2).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q -c constraints.txt -e '.[torch,test,bench,cli]'
# test utilities whose declared pins conflict with ours, without their dependencies
.venv/bin/pip install -q --no-deps -r requirements-nodeps.txt
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# pytest exits 5 when it collected no test: that is a failure here, not a pass.
.venv/bin/python -m pytest -q "$@"
