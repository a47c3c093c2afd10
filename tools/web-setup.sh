#!/usr/bin/env bash
# Installs what the browser build and tests need, skipping what is already there:
#   - Debian's `rustc-web` (a second Rust toolchain, 1.96, in /usr/bin) with its standard
#     library source (`rust-web-src`), so `-Zbuild-std` can build std for
#     wasm32-unknown-unknown (rustup cannot download that target's library here, and its
#     compiler cannot build another version's source); `lld-22` is its linker (`rust-lld`).
#   - `wasm-bindgen-cli` at the version of `wasm-bindgen` in Cargo.lock (the two must
#     match): `wasm-bindgen` and `wasm-bindgen-test-runner`.
#   - Chromium and its WebDriver (`chromium-driver`): headless, its WebGPU adapter is
#     SwiftShader behind Dawn and Tint.
# Usage: tools/web-setup.sh   (as root, or with passwordless apt-get)
set -euo pipefail
cd "$(dirname "$0")/.."

apt_pkgs=()
[ -x /usr/bin/rustc ] && [ -d /usr/lib/rustlib/src/rust/library ] || apt_pkgs+=(rustc-web cargo-web rust-web-src)
command -v rust-lld >/dev/null 2>&1 || [ -x /usr/bin/lld-22 ] || apt_pkgs+=(lld-22)
[ -x /usr/bin/chromium ] || apt_pkgs+=(chromium)
[ -x /usr/bin/chromedriver ] || apt_pkgs+=(chromium-driver)
command -v python3 >/dev/null 2>&1 || apt_pkgs+=(python3)
if [ ${#apt_pkgs[@]} -gt 0 ]; then
    echo "web-setup: apt-get install ${apt_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${apt_pkgs[@]}" >/dev/null
fi

# The CLI must be the same version as the `wasm-bindgen` crate the build links.
want=$(awk '/^name = "wasm-bindgen"$/ {getline; gsub(/"/, "", $3); print $3; exit}' Cargo.lock)
if [ -z "$want" ]; then
    echo "web-setup: no wasm-bindgen in Cargo.lock" >&2
    exit 1
fi
have=$(wasm-bindgen --version 2>/dev/null | awk '{print $2}' || true)
if [ "$have" != "$want" ]; then
    echo "web-setup: cargo install wasm-bindgen-cli --version $want (about 4 minutes)"
    # Not `--locked`: the CLI's lock file names a `webpki-roots` no longer in the index.
    cargo install wasm-bindgen-cli --version "$want"
fi
echo "web-setup: ready (rustc-web $(/usr/bin/rustc --version | awk '{print $2}'), wasm-bindgen $want, $(/usr/bin/chromium --version 2>/dev/null | head -n 1))"
