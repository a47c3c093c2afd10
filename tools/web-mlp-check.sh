#!/usr/bin/env bash
# CI's browser check of the web trainer (examples/web_mlp): builds it (tools/web-mlp.sh),
# then tools/web_mlp_check.py runs it in headless Chromium (SwiftShader's WebGPU) for STEPS
# steps, requires a training accuracy of at least MIN_ACCURACY percent (native `train_mlp
# --optimizer adamw --steps 300` reaches 99.17 %; one point less is allowed), checks the
# device-lost and no-WebGPU errors, and saves a screenshot to target/web-mlp/screenshot.png.
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${STEPS:-300}"
min_accuracy="${MIN_ACCURACY:-98.17}"
tools/web-mlp.sh --build-only
python3 tools/web_mlp_check.py target/web-mlp --steps "$steps" --min-accuracy "$min_accuracy" \
    --screenshot target/web-mlp/screenshot.png
