# Sourced by the web scripts: the wasm32 toolchain (Debian's rustc-web, which can build
# std for wasm32-unknown-unknown from its source) and the flags every web build uses.
# A separate target directory keeps these builds apart from the native ones.
web_missing=()
[ -x /usr/bin/rustc ] && [ -d /usr/lib/rustlib/src/rust/library ] || web_missing+=("rustc-web and rust-web-src (apt-get install rustc-web cargo-web rust-web-src)")
command -v rust-lld >/dev/null 2>&1 || [ -x /usr/bin/lld-22 ] || web_missing+=("lld-22 (apt-get install lld-22)")
[ -x /usr/bin/chromium ] || web_missing+=("chromium (apt-get install chromium)")
[ -x /usr/bin/chromedriver ] || web_missing+=("chromedriver (apt-get install chromium-driver)")
command -v python3 >/dev/null 2>&1 || web_missing+=("python3 (apt-get install python3)")
web_bindgen=$(awk '/^name = "wasm-bindgen"$/ {getline; gsub(/"/, "", $3); print $3; exit}' Cargo.lock)
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$web_bindgen" ]; then
    web_missing+=("wasm-bindgen $web_bindgen (cargo install wasm-bindgen-cli --version $web_bindgen)")
fi
if [ ${#web_missing[@]} -gt 0 ]; then
    echo "missing tools (tools/web-setup.sh installs them all):" >&2
    printf '  %s\n' "${web_missing[@]}" >&2
    exit 2
fi
export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${WEB_TARGET_DIR:-$PWD/target/web}"
web_cargo() {
    /usr/bin/cargo "$@" -Zbuild-std=std,panic_abort --target wasm32-unknown-unknown
}
