#!/usr/bin/env bash
# System packages the test suite needs (Debian). Installs only what is missing; run as root (CI is root).
# Each block names the tests that need it.
set -euo pipefail
need=()
# (blocks are added below by the features that need them)
# tests/test_ui.py (browser test of the Dagster UI): headless Chromium and its WebDriver, from Debian.
if [[ ! -x /usr/bin/chromium ]]; then need+=(chromium); fi
if [[ ! -x /usr/bin/chromedriver ]]; then need+=(chromium-driver); fi
# tests/test_scale.py (production instance): a real PostgreSQL server (initdb/postgres under
# /usr/lib/postgresql/*/bin, started by the test on 127.0.0.1 as the `postgres` user, which the
# package creates) and runuser (util-linux) to drop root for it.
if ! compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; then need+=(postgresql); fi
if ! command -v runuser >/dev/null; then need+=(util-linux); fi
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "system-deps: missing ${need[*]}; run as root: apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
