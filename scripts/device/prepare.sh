#!/usr/bin/env bash
# Here, before a device run: packs deno, node_modules and the Vulkan loader into .gpu/ (shared's pack.sh)
# and copies the fixtures' generator there (the GPU machine has no ../shared).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash ../shared/device/pack.sh
mkdir -p .gpu/fixtures && cp ../shared/fixtures/make_fixtures.py .gpu/fixtures/
