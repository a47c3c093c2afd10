#!/usr/bin/env bash
# Builds the browser trainer (examples/web_mlp: train_mlp's spirals MLP on WebGPU with the
# crate's fused AdamW) for wasm32 and serves it on http://127.0.0.1:$PORT/ (default 8028).
#   tools/web-mlp.sh               build, then serve until interrupted
#   tools/web-mlp.sh --build-only  build into target/web-mlp/ and stop
# Needs the toolchain of tools/web-setup.sh: Debian's rustc-web with its library source
# (std built for wasm32 with -Zbuild-std) and wasm-bindgen at Cargo.lock's version. Open
# the page in a browser with WebGPU (Chrome, Edge; headless Chromium needs
# --enable-unsafe-webgpu); `?steps=N` sets the run's length.
set -euo pipefail
cd "$(dirname "$0")/.."

# The wasm32 toolchain and `web_cargo` (Debian's cargo with -Zbuild-std, target/web).
source tools/web-env.sh

site=target/web-mlp
web_cargo build --release -p web-mlp
mkdir -p "$site"
wasm-bindgen --target web --no-typescript --out-dir "$site/pkg" \
    "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/web_mlp.wasm"
cp examples/web_mlp/index.html "$site/index.html"
echo "web-mlp: built $site ($(du -h "$site/pkg/web_mlp_bg.wasm" | cut -f1) of wasm)"
if [ "${1:-}" = "--build-only" ]; then
    exit 0
fi
port="${PORT:-8028}"
echo "web-mlp: open http://127.0.0.1:$port/ (Ctrl-C stops the server)"
exec python3 -m http.server --bind 127.0.0.1 --directory "$site" "$port"
