#!/usr/bin/env bash
# The test command: installs what is missing, starts the real local stack, runs every test
# (unit and against the real services), and always stops the stack again.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh

started_here=0
if ! .venv/bin/ki stack status >/dev/null 2>&1; then
  started_here=1
fi
stop_stack() {
  if [ "$started_here" -eq 1 ] && [ "${KI_KEEP_STACK:-0}" != "1" ]; then
    .venv/bin/ki stack down || true
  fi
}
trap stop_stack EXIT

.venv/bin/ki stack up
.venv/bin/pytest "$@"
