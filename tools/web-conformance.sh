#!/usr/bin/env bash
# Runs every conformance vector in DIR (`*.safetensors` directly in it, format in
# tests/vectors/FORMAT.md) in headless Chromium on its WebGPU adapter: the testkit's reader
# and runner compiled to wasm32 (web/src/lib.rs), on a page served from 127.0.0.1. Prints
# one line per case and backend and the native runner's closing line; exits non-zero when
# anything failed. f64 cases are refused on the GPU (WebGPU has no f64), as they must be.
# The CPU backend is not run (no threads in a page).
#
# Usage: tools/web-conformance.sh DIR   (tools: tools/web-setup.sh installs them)
set -euo pipefail
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
    echo "usage: tools/web-conformance.sh DIR   (a directory of *.safetensors vector files)" >&2
    exit 2
fi
dir=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
source tools/web-env.sh

# With the browser test target in the same build, the dependencies are built as
# tools/web-test.sh builds them (its dev-dependencies widen serde's and num-traits'
# features, and -Zbuild-std adds std's test crate), so after it only this crate compiles:
# the library built alone recompiled the whole tree (3 minutes in CI).
web_cargo build -p wgpu-optim-web --lib --test browser
serve=$(mktemp -d)
server=""
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
    rm -rf "$serve"
}
trap cleanup EXIT
wasm-bindgen --target web --no-typescript --out-dir "$serve/pkg" \
    "$CARGO_TARGET_DIR/wasm32-unknown-unknown/debug/wgpu_optim_web.wasm"
cp web/www/conformance.html "$serve/index.html"
ln -s "$dir" "$serve/vectors"
python3 - "$dir" "$serve/index.json" <<'PY'
import json, os, sys
# As the native runners list them (the testkit's `vector_files`): files only, directly in DIR.
names = sorted(n for n in os.listdir(sys.argv[1])
               if n.endswith(".safetensors") and os.path.isfile(os.path.join(sys.argv[1], n)))
if not names:
    sys.exit(f"{sys.argv[1]} holds no *.safetensors vector file: a run would check nothing")
json.dump(names, open(sys.argv[2], "w"))
PY
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$serve" "$port" >/dev/null 2>&1 &
server=$!
for _ in $(seq 50); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/index.json')" 2>/dev/null && break
    sleep 0.1
done
python3 tools/web_page.py "http://127.0.0.1:$port/index.html" "${WEB_CONFORMANCE_TIMEOUT:-1800}"
