#!/usr/bin/env bash
# The tests on a fresh machine: installs what is missing (tools/setup.sh), then runs every
# test on Vulkan (lavapipe where there is no GPU) with the Burn integration's among them, and
# again on the GL backend (llvmpipe through EGL), one test at a time (GL contexts serialize).
# `.ci/run` runs this same script. Usage: tools/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
# Mesa's loader warns without a runtime directory; give it one.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"

start=$SECONDS
cargo test --features burn
echo "test: Vulkan took $((SECONDS - start)) s"
start=$SECONDS
WGPU_BACKEND=gl cargo test --features gles -- --test-threads=1
echo "test: GL took $((SECONDS - start)) s"
