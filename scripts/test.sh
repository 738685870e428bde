#!/usr/bin/env bash
# The test command: installs what is missing, starts the real local stack on a throwaway state
# directory (so tests never see or touch demo data, and always start from empty topics and tables),
# runs every test (unit and against the real services), and always stops the stack again.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --test

main_home=$(.venv/bin/python -c 'from ki.settings import load_settings; print(load_settings().stack.home)')
main_home=${main_home/#\~/$HOME}
export KI_STACK__HOME="${KI_TEST_STACK_HOME:-$HOME/.cache/ki-sidecar-test}"

.venv/bin/ki stack down >/dev/null 2>&1 || true
# Every service's data wherever it lives (under root, PostgreSQL's and OpenSearch's are in
# /var/lib/ki-sidecar/<home>-<hash>/, owned by the postgres account), logs and pid files.
.venv/bin/ki stack wipe >/dev/null
mkdir -p "$KI_STACK__HOME" "$main_home/artifacts"
# Share the resolved artifacts with the main stack: resolving twice would only cost time.
[ -e "$KI_STACK__HOME/artifacts" ] || ln -s "$main_home/artifacts" "$KI_STACK__HOME/artifacts"

stop_stack() {
  if [ "${KI_KEEP_STACK:-0}" != "1" ]; then
    .venv/bin/ki stack down || true
  fi
}
trap stop_stack EXIT

# KI_TEST_IDP=1: the identity-provider tests' run (tests/idp/), with Keycloak started as well.
if [ "${KI_TEST_IDP:-0}" = "1" ]; then
  .venv/bin/ki stack up --idp
elif [ "${KI_TEST_SECURE:-0}" = "1" ]; then
  # KI_TEST_SECURE=1: the secured profile's run (tests/secure/); every ki command after it as the operator.
  .venv/bin/ki stack up --secure
  set -a
  . "$KI_STACK__HOME/secure/operator.env"
  set +a
else
  .venv/bin/ki stack up
fi
.venv/bin/pytest "$@"
