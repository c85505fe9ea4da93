#!/usr/bin/env bash
# Here, before a device run: packs deno, node_modules and the Vulkan loader into .gpu/ (shared's pack.sh)
# and copies the fixtures' generator there (the GPU machine has no ../shared).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash ../shared/device/pack.sh
mkdir -p .gpu/fixtures && cp ../shared/fixtures/make_fixtures.py .gpu/fixtures/
# The carry limit is 64 MiB with the tree: repack node_modules without what the GPU machine never loads (iroh's
# musl build beside the glibc one, tiktoken's bundled encoders: Kimi's vocabulary comes from its checkpoint).
if [ -d node_modules ]; then
  tar -cJf .gpu/deps.tar.xz --exclude='*iroh-linux-x64-musl*' --exclude='node_modules/.deno/tiktoken@*/node_modules/tiktoken/encoders' node_modules
  du -sh .gpu
fi
