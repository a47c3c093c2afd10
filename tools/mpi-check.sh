#!/usr/bin/env bash
# Sharding over MPI (feature `mpi`): installs OpenMPI and libclang where they are missing
# (Debian or Ubuntu; as root, or with sudo), lints and builds examples/shard_mpi.rs and
# examples/train_mlp_sharded, runs the collectives' checks on 1, 2 and 3 ranks (3 on two
# cores: --oversubscribe), trains the MLP data-parallel on 2 and 3 MPI ranks and on 3
# in-process ranks against the single-process run (AdamW; LAMB and Adafactor on 2 and 3
# ranks), resumes the 3 ranks' checkpoint on 2
# ranks and on 1, and checks that a rank that panics or dies mid-step ends the job with an
# error within seconds.
# `.ci/run` runs it. Usage: tools/mpi-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

packages=()
command -v mpirun >/dev/null 2>&1 || packages+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || packages+=(libopenmpi-dev)
# bindgen (mpi-sys) loads libclang.
ldconfig -p | grep -q 'libclang[-.0-9]*\.so' || packages+=(libclang-dev)
if [ ${#packages[@]} -gt 0 ]; then
    as_root=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "mpi-check: need ${packages[*]} (run as root)" >&2; exit 1; }
        as_root=(sudo)
    fi
    echo "mpi-check: installing ${packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" apt-get install -y -qq "${packages[@]}" >/dev/null
fi

# The native feature set of .ci/run and tools/test.sh, plus `mpi`: only the library is
# compiled again.
FEATURES=(--features wgpu-optim/gles,wgpu-optim/mpi)
examples=(--example shard_mpi --example train_mlp_sharded --example shard_bench)
cargo clippy "${FEATURES[@]}" --lib "${examples[@]}" -- -D warnings
cargo build "${FEATURES[@]}" "${examples[@]}"
example=target/debug/examples/shard_mpi
# mpirun as root (CI) needs the flag; OpenMPI in some containers needs the vader setting.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
run() { timeout 120 mpirun --allow-run-as-root --oversubscribe "$@"; }

for ranks in 1 2 3; do
    run -np "$ranks" "$example"
done

start=$SECONDS
if run -np 2 "$example" --panic-rank 1 >/tmp/mpi-check-panic.log 2>&1; then
    echo "mpi-check: a rank panicked, yet the job succeeded" >&2
    exit 1
fi
took=$((SECONDS - start))
grep -q "rank 1 fails mid-step" /tmp/mpi-check-panic.log
if [ "$took" -gt 30 ]; then
    echo "mpi-check: the job with a panicking rank took $took s to end" >&2
    exit 1
fi
echo "mpi-check: a panicking rank ended the job with an error in $took s"

# The sharded step's split on the CPU backend (a small run: the example's numbers are a
# release build's, PERF.md).
run -np 2 target/debug/examples/shard_bench --params 65536 --steps 2

# Data-parallel training: N ranks end within f32 trajectory tolerance of one.
trainer=target/debug/examples/train_mlp_sharded
reference=$(mktemp)
"$trainer" --save "$reference"
run -np 2 "$trainer" --compare "$reference"
checkpoint=$(mktemp -d)
trap 'rm -rf "$reference" "$checkpoint" "${lamb_reference:-}" "${adafactor_reference:-}"' EXIT
run -np 3 "$trainer" --compare "$reference" --checkpoint-at 100 --checkpoint-dir "$checkpoint"
"$trainer" --in-process 3 --compare "$reference"

# LAMB: its tensors in the flat layout, each tensor's sums combined across the ranks.
lamb_reference=$(mktemp)
"$trainer" --lamb --save "$lamb_reference"
run -np 3 "$trainer" --lamb --compare "$lamb_reference"

# Adafactor: its matrices cut mid-row, each one's row and column sums combined across ranks.
# 100 steps: past about 150 its trajectory on this model turns chaotic (flipping the last
# bit of every gradient on one rank moves the 200-step parameters by 1e-3 of the largest,
# the 100-step ones by 4e-7).
adafactor_reference=$(mktemp)
"$trainer" --adafactor --steps 100 --save "$adafactor_reference"
run -np 2 "$trainer" --adafactor --steps 100 --compare "$adafactor_reference"
run -np 3 "$trainer" --adafactor --steps 100 --compare "$adafactor_reference"

# A checkpoint saved on 3 ranks continues on 2 MPI ranks and on 1, to the same end.
run -np 2 "$trainer" --resume "$checkpoint" --compare "$reference"
"$trainer" --resume "$checkpoint" --compare "$reference"

# A rank that panics, or whose process dies, ends the run with an error within seconds.
fails_quickly() {
    local what=$1 expect=$2
    shift 2
    local start=$SECONDS log
    log=$(mktemp)
    if "$@" >"$log" 2>&1; then
        echo "mpi-check: $what, yet the run succeeded" >&2
        exit 1
    fi
    local took=$((SECONDS - start))
    grep -q "$expect" "$log" || { echo "mpi-check: $what: no \"$expect\" in:" >&2; cat "$log" >&2; exit 1; }
    if [ "$took" -gt 30 ]; then
        echo "mpi-check: $what: the run took $took s to end" >&2
        exit 1
    fi
    echo "mpi-check: $what: the run ended with an error in $took s"
}
fails_quickly "an MPI rank panicked mid-training" "rank 1 fails at step 5" \
    run -np 3 "$trainer" --panic-rank 1 --at-step 5
fails_quickly "an MPI rank died mid-training" "rank 2 dies at step 5" \
    run -np 3 "$trainer" --die-rank 2 --at-step 5
fails_quickly "an in-process rank panicked mid-training" "left the group" \
    "$trainer" --in-process 3 --panic-rank 1 --at-step 5
