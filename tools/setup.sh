#!/usr/bin/env bash
# Installs what the GPU tests and the bench need on a machine without them, skipping what is
# already there: a Vulkan driver (Mesa's lavapipe, a CPU implementation) where none is
# installed, and EGL with GLES (Mesa's llvmpipe behind them) for the GL backend's tests.
# Debian or Ubuntu; as root, or with sudo. The browser's toolchain is tools/web-setup.sh's.
# Usage: tools/setup.sh
set -euo pipefail

have_vulkan_driver() {
    local icds
    icds=$(find /usr/share/vulkan/icd.d /etc/vulkan/icd.d -name '*.json' 2>/dev/null | head -n 1)
    [ -n "$icds" ] && ldconfig -p | grep -q libvulkan.so.1
}
have_gles() {
    ldconfig -p | grep -q libEGL_mesa.so.0 && ldconfig -p | grep -q libGLESv2.so.2
}

packages=()
have_vulkan_driver || packages+=(mesa-vulkan-drivers libvulkan1)
have_gles || packages+=(libegl1 libegl-mesa0 libgles2)
if [ ${#packages[@]} -eq 0 ]; then
    exit 0
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "setup: need ${packages[*]}; run as root: apt-get install -y ${packages[*]}" >&2
        exit 1
    fi
    as_root=(sudo)
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: need a Vulkan driver and EGL/GLES (Debian: ${packages[*]}); no apt-get here" >&2
    exit 1
fi
echo "setup: installing ${packages[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq "${packages[@]}" >/dev/null
