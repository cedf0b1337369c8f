#!/usr/bin/env bash
# The project's test command, from a fresh clone: makes the virtual environment when it is missing or its
# requirement files changed (exactly as CI does: .ci/run calls this), then runs pytest in it.
#
#   bash scripts/test.sh                       # the whole suite: python -m pytest -q -ra -n 2 --dist loadfile
#   bash scripts/test.sh tests/test_x.py -k y  # any pytest arguments instead
#   bash scripts/test.sh --setup-only          # the environment only
#
# Environment: VENV (.venv), TORCH_VERSION (2.13.0; CPU build from the configured index or find-links),
# TEST_WORKERS (2: pytest-xdist processes for the whole suite, each with its own session tritonserver; 0 = one).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${VENV:-.venv}
torch_version=${TORCH_VERSION:-2.13.0}
marker=$venv/.tritontts-test-setup
wanted=$(cat requirements.txt requirements-dev.txt pyproject.toml <(echo "torch==$torch_version") | sha256sum | cut -d' ' -f1)

setup() {
  echo "scripts/test.sh: setting up $venv (torch==$torch_version, requirements-dev.txt, this package)"
  python3 -m venv "$venv"
  # shellcheck disable=SC1091
  source "$venv/bin/activate"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  # The CPU build of torch first, so nothing later pulls a CUDA build.
  pip install -qq "torch==$torch_version"
  pip install -qq -r requirements-dev.txt
  pip install -qq --no-deps -e .
  # espeak-ng speaks the English test prompts; docker-compose validates docker-compose.yml (no engine needed).
  local missing=()
  command -v espeak-ng >/dev/null 2>&1 || missing+=(espeak-ng)
  command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
  if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null) \
      || echo "could not install ${missing[*]}: the tests that need them skip"
  fi
  python -c "import numpy; assert numpy.__version__ < '2', numpy.__version__"
  echo "$wanted" >"$marker"
}

if [ ! -x "$venv/bin/python" ] || [ "$(cat "$marker" 2>/dev/null)" != "$wanted" ]; then
  setup
fi
[ "${1:-}" != --setup-only ] || exit 0
# shellcheck disable=SC1091
source "$venv/bin/activate"
if [ $# -eq 0 ]; then set -- -q -ra --durations=25 -n "${TEST_WORKERS:-2}" --dist loadfile; fi
exec python -m pytest "$@"
