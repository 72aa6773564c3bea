#!/usr/bin/env bash
# Takes a fresh Debian machine to ready for strata: a virtual environment in .venv with torch
# 2.13.0 (installed first: a CPU build of that release is on the project's machines, any other
# version pulls gigabytes), strata with every extra, and the Mosquitto broker binary.
# Re-running on a ready machine takes well under a second and changes nothing.
#
# The container images (docker/*.Dockerfile) install through this same script, with:
#   STRATA_VENV         where the virtual environment goes (default .venv)
#   STRATA_EXTRAS       the extras to install (default all,dev); torch only when they include cloud or all
#   STRATA_EDITABLE     1 (default): an editable install of this checkout; 0: a regular install
#   STRATA_TORCH_INDEX  the package index to take torch from (an image's CPU build); default: pip's own
#   STRATA_BROKER       install (default) or skip the Mosquitto broker binary
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${STRATA_VENV:-.venv}
EXTRAS=${STRATA_EXTRAS:-all,dev}
EDITABLE=${STRATA_EDITABLE:-1}
TORCH_INDEX=${STRATA_TORCH_INDEX:-}
BROKER=${STRATA_BROKER:-install}
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      PYTHON=$candidate; break
    fi
  done
fi
[ -n "$PYTHON" ] || { echo "setup: strata needs Python >= 3.11 (none found on PATH)" >&2; exit 1; }

# The stamp names the inputs of the install: when none changed, the environment is ready.
stamp_key=$( (cat pyproject.toml scripts/setup.sh; echo "$EXTRAS $EDITABLE $TORCH_INDEX") | sha256sum | cut -c1-16)
stamp="$VENV/.strata-ready-$stamp_key"

# pip's own warnings about this machine's local package mirrors are noise to a newcomer.
pip_install() {
  "$VENV/bin/python" -m pip install --quiet "$@" 2>&1 | { grep -vE "^WARNING: Location '.*' is ignored" || true; }
}

if [ ! -f "$stamp" ]; then
  echo "setup: preparing $VENV (first run takes a few minutes)"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  pip_install --upgrade pip
  case ",$EXTRAS," in
    *,cloud,*|*,all,*)
      if [ -n "$TORCH_INDEX" ]; then pip_install --index-url "$TORCH_INDEX" "torch==2.13.0"
      else pip_install "torch==2.13.0"; fi ;;
  esac
  if [ "$EDITABLE" = 1 ]; then pip_install -e ".[$EXTRAS]"; else pip_install ".[$EXTRAS]"; fi
  rm -f "$VENV"/.strata-ready-*
  touch "$stamp"
fi

if [ "$BROKER" != skip ] && ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing the Mosquitto broker with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends mosquitto >/dev/null
  else
    echo "setup: the Mosquitto broker is missing; install it as root with 'apt-get install mosquitto'" \
         "(or your platform's package). The demo works without it; the test suite needs it." >&2
  fi
fi
