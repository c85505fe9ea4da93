#!/usr/bin/env bash
# The test command (README, .ci/run): everything a reviewer checks, with no GPU needed.
# Installs what the tests need on a fresh machine: deno (scripts/deno_env.sh) and Mesa's Vulkan
# software driver (lavapipe) for the WebGPU kernel tests, then runs `deno task ok`.
set -euo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/deno_env.sh"
cd "$swactor_root"
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing mesa-vulkan-drivers (software WebGPU adapter)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers) >/dev/null 2>&1 \
      || echo "test.sh: could not install mesa-vulkan-drivers; WebGPU runs on GL or tests skip" >&2
  else
    echo "test.sh: no lavapipe and not root: WebGPU tests use whatever adapter exists, or skip" >&2
  fi
fi
# The dashboard's browser test (tests/cli/serve_test.ts) drives Debian's chromium; it installs it too when
# missing, but doing it here keeps minutes of apt-get out of a test's time.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test.sh: installing chromium (the dashboard's browser test)" >&2
  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium || (apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)) >/dev/null 2>&1 \
    || echo "test.sh: could not install chromium; the dashboard's browser test will say it is skipped" >&2
fi
exec "$DENO" task ok "$@"
