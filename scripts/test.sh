#!/usr/bin/env bash
# The test command: installs what is missing, starts the real local stack on a throwaway state
# directory (so tests never see or touch demo data, and always start from empty topics and tables),
# runs every test (unit and against the real services), and always stops the stack again.
#
# Without arguments the tests run in two lanes at once, each on a stack of its own: the fault-injection
# tests (`-m faults`: services stopped, workers killed; mostly waiting), the long independent ones
# (`-m second_lane`: rebuilds, benchmark smoke runs) and the unit tests (`-m "not stack"`: no services, they
# fill the fault tests' waits) on a second stack whose ports are shifted by 1000 and whose home is
# "$KI_STACK__HOME-faults" (log: build/test-faults.log), the other stack tests here. With arguments: one
# lane, `pytest "$@"`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --test

main_home=$(.venv/bin/python -c 'from ki.settings import load_settings; from apps.dev.stack.settings import stack_settings; print(stack_settings(load_settings()).home)')
main_home=${main_home/#\~/$HOME}
export KI_STACK__HOME="${KI_TEST_STACK_HOME:-$HOME/.cache/ki-sidecar-test}"
# The test stacks live for minutes: Kafka, Connect and Keycloak with the quick JIT only (stack.quick_jit) spend
# about half the CPU, which the other lanes' stacks on the same cores need.
export KI_STACK__QUICK_JIT="${KI_STACK__QUICK_JIT:-true}"

# One lane: a fresh stack at $KI_STACK__HOME (and the ports in the environment), pytest, the stack stopped.
run_lane() {
  .venv/bin/ki stack down >/dev/null 2>&1 || true
  # Every service's data wherever it lives (under root, PostgreSQL's and OpenSearch's are in
  # /var/lib/ki-sidecar/<home>-<hash>/, owned by the postgres account), logs and pid files.
  .venv/bin/ki stack wipe >/dev/null
  mkdir -p "$KI_STACK__HOME" "$main_home/artifacts"
  # Share the resolved artifacts with the main stack: resolving twice would only cost time.
  [ -e "$KI_STACK__HOME/artifacts" ] || ln -s "$main_home/artifacts" "$KI_STACK__HOME/artifacts"
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
  elif [ "${KI_TEST_CLUSTER:-0}" = "1" ]; then
    # KI_TEST_CLUSTER=1: the cluster profile's run (tests/cluster/); every ki command after it on the cluster.
    .venv/bin/ki stack up --cluster
    set -a
    . "$KI_STACK__HOME/cluster.env"
    set +a
  else
    .venv/bin/ki stack up
  fi
  .venv/bin/pytest "$@"
}

stop_stack() {
  if [ "${KI_KEEP_STACK:-0}" != "1" ]; then
    .venv/bin/ki stack down || true
  fi
}

# KI_TEST_PORT_SHIFT=N: this run's stack on ports shifted by N (beside another stack, e.g. CI's lanes).
if [ "${KI_TEST_PORT_SHIFT:-0}" != "0" ]; then
  set -a
  eval "$(.venv/bin/python -m apps.dev.stack.ports --shift "$KI_TEST_PORT_SHIFT")"
  set +a
fi

if [ $# -gt 0 ]; then
  run_lane "$@"
  exit
fi

# Two lanes: the faults lane in the background on its own stack, the rest here; both always finish.
mkdir -p build
faults_shift=$(( ${KI_TEST_PORT_SHIFT:-0} + 1000 ))
(
  export KI_STACK__HOME="$KI_STACK__HOME-faults"
  set -a
  eval "$(.venv/bin/python -m apps.dev.stack.ports --shift "$faults_shift")"
  set +a
  run_lane --durations=25 --junitxml=build/junit-faults.xml -m "faults or second_lane or not stack"
) >build/test-faults.log 2>&1 &
faults_pid=$!
echo "test: the fault-injection tests run beside these on a second stack (log: build/test-faults.log)"
# In the background too, so that `set -e` holds inside the lane (it does not in a `( … ) || …` list).
# --durations: each lane's slowest tests at the end of its log, to see where CI minutes go; --junitxml: every
# test's time (build/junit-*.xml), to balance the lanes.
(run_lane --durations=25 --junitxml=build/junit-main.xml -m "stack and not faults and not second_lane") &
main_pid=$!
main_status=0
wait "$main_pid" || main_status=$?
faults_status=0
wait "$faults_pid" || faults_status=$?
echo "test: fault-injection lane (build/test-faults.log):"
grep -E "^(FAILED|ERROR) " build/test-faults.log || true
tail -n 25 build/test-faults.log
echo "test: lanes finished: main exit $main_status, faults exit $faults_status"
# The optional suites need stacks of their own: say which this run left out, and how to run them.
echo "test: not run by this command (each starts its own stack; .ci/run runs them):" \
  "identity provider (KI_TEST_IDP=1 scripts/test.sh tests/idp)," \
  "secured profile (KI_TEST_SECURE=1 scripts/test.sh tests/secure)," \
  "cluster profile (KI_TEST_CLUSTER=1 scripts/test.sh -s tests/cluster)"
[ "$main_status" -eq 0 ] && [ "$faults_status" -eq 0 ]
