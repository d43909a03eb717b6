#!/usr/bin/env bash
# Installs what wren needs to build and test on a fresh Debian/Ubuntu machine (idempotent):
# the C toolchain and libraries from the distribution, and a Python venv with the pinned
# reference libraries used by the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake pkg-config libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
      python3 python3-venv python3-pip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

if [ "${1:-}" != "--no-python" ]; then
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  if ! cmp -s tests/requirements.txt .venv/.requirements 2>/dev/null; then
    .venv/bin/python -m pip install -q pip==26.3 # pinned like the requirements: the same resolver everywhere
    .venv/bin/python -m pip install -q -r tests/requirements.txt
    cp tests/requirements.txt .venv/.requirements
  fi
fi
