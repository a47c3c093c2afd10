#!/usr/bin/env bash
# The tests on a fresh machine: installs what is missing (tools/setup.sh), builds every test
# of the workspace once (the library, the testkit, the oracle and the Burn crate, with wgpu's
# GL backend compiled in beside Vulkan), then runs the same binaries on Vulkan (lavapipe
# where there is no GPU) and again on the GL backend (llvmpipe through EGL).
#
# With cargo-nextest installed (`.ci/run` installs it) the runs go through it: each test in
# a process of its own, the GL run's device tests one at a time (.config/nextest.toml), and
# the doctests through `cargo test --doc`. Without it, plain `cargo test` runs the same
# tests, GL's one at a time. The Burn crate's tests run on Vulkan only (.config/nextest.toml
# says why). `.ci/run` runs this same script. Usage: tools/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
# Mesa's loader warns without a runtime directory; give it one.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"

# One feature set for every run, so that the wgpu stack is compiled once.
FEATURES=(--features wgpu-optim/gles)

timed() {
    local name=$1 start=$SECONDS
    shift
    "$@"
    echo "test: $name took $((SECONDS - start)) s"
}

if cargo nextest --version >/dev/null 2>&1; then
    timed "build" cargo nextest run "${FEATURES[@]}" --no-run
    timed "Vulkan" env WGPU_BACKEND=vulkan cargo nextest run "${FEATURES[@]}"
    # The doctests open no device (they set options or run the CPU backend): they run once.
    timed "doctests" cargo test "${FEATURES[@]}" --doc
    timed "GL" env WGPU_BACKEND=gl cargo nextest run "${FEATURES[@]}" --profile gl
else
    timed "Vulkan" env WGPU_BACKEND=vulkan cargo test "${FEATURES[@]}"
    # Without the Burn crate, whose tests run on Vulkan only; cargo resolves this selection's
    # features apart, so this form compiles the wgpu stack a second time.
    timed "GL" env WGPU_BACKEND=gl cargo test "${FEATURES[@]}" -p wgpu-optim -p wgpu-optim-testkit --lib --tests -- --test-threads=1
fi
