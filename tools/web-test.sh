#!/usr/bin/env bash
# Checks the featureless library for wasm32-unknown-unknown (the browser build a trainer
# gets with `default-features = false`; `check`, as nothing runs it), then builds the
# library with `checkpoint` and the testkit as the browser tests use them and runs the
# browser tests (web/tests/browser.rs) in headless Chromium on its WebGPU adapter,
# through wasm-bindgen-test-runner and chromedriver (Chrome's flags: web/webdriver.json).
# Install the tools first with tools/web-setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/web-env.sh

start=$(date +%s)
web_cargo check -p wgpu-optim --no-default-features
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner
export CHROMEDRIVER=/usr/bin/chromedriver
# The whole suite runs in one page; SwiftShader is a CPU adapter.
export WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-900}"
web_cargo test -p wgpu-optim-web --test browser
echo "web-test: $(( $(date +%s) - start )) s"
