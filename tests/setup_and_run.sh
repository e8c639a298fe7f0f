#!/usr/bin/env bash
# Build a fresh virtual environment, install the project with its test extras, run ruff and pytest.
# Usage: bash tests/setup_and_run.sh [VENV_DIR] [extra pip requirement ...]
#   The extra requirements are installed in the SAME pip command as the project (never add packages
#   to an existing environment: pip would resolve them against what is there).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-test}
shift || true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0          # the CPU wheel; never let torch resolve on its own
"$venv/bin/pip" install -q -e ".[test,demo,seq2seq,integrations]" "$@"
"$venv/bin/ruff" check .
"$venv/bin/python" -m pytest -q tests
