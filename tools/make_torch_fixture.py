#!/usr/bin/env python3
"""Writes the PyTorch resume fixtures of tests/integration/torch_checkpoint.rs.

    python3 tools/make_torch_fixture.py tests/fixtures/torch [CASE...]

For each case, PyTorch's optimizer runs 5 steps on three f32 parameters of shapes (8, 5),
(5,) and (3, 4, 2) with fixed gradients; its state_dict is converted with
`torch_checkpoint.py from-torch` into CASE.optimizer.safetensors. CASE.trajectory.safetensors
holds the parameters after those 5 steps (`param.i`), the gradients of the next 5
(`grad.k.i`, k = 0..4) and PyTorch's parameters after each of them (`expected.k.i`).
"""

import argparse
import os
import sys
import tempfile

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_checkpoint  # noqa: E402

SHAPES = [(8, 5), (5,), (3, 4, 2)]
# Each case's optimizer and the seed of its parameters and gradients.
CASES = [
    ("adam", 1000, lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.01)),
    ("adamw", 1001, lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1)),
    ("amsgrad", 1002, lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True)),
    ("sgd_momentum", 1003, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd_nesterov", 1004, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True)),
    ("adagrad", 1005, lambda p: torch.optim.Adagrad(
        p, lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1)),
    ("rmsprop", 1006, lambda p: torch.optim.RMSprop(p, lr=1e-2, weight_decay=0.01)),
    ("rmsprop_centered_momentum", 1007, lambda p: torch.optim.RMSprop(
        p, lr=1e-2, alpha=0.9, eps=1e-6, momentum=0.9, centered=True, maximize=True)),
    ("adafactor", 1008, lambda p: torch.optim.Adafactor(p, lr=1e-2, weight_decay=0.01)),
    ("adafactor_eps1_maximize", 1009, lambda p: torch.optim.Adafactor(
        p, lr=1e-2, beta2_decay=-0.5, eps=(1e-3, 1e-3), d=2.0, maximize=True)),
]


def gradients(generator):
    return [torch.randn(shape, generator=generator) * 0.5 for shape in SHAPES]


def main(directory, only):
    unknown = set(only) - {name for name, _, _ in CASES}
    if unknown:
        sys.exit(f"make_torch_fixture: no case {sorted(unknown)}")
    os.makedirs(directory, exist_ok=True)
    for name, seed, make in CASES:
        if only and name not in only:
            continue
        generator = torch.Generator().manual_seed(seed)
        params = [torch.randn(shape, generator=generator).requires_grad_() for shape in SHAPES]
        optimizer = make(params)
        for _ in range(5):
            for p, g in zip(params, gradients(generator)):
                p.grad = g
            optimizer.step()
        with tempfile.TemporaryDirectory() as scratch:
            saved = os.path.join(scratch, "state.pt")
            torch.save(optimizer.state_dict(), saved)
            target = os.path.join(directory, f"{name}.optimizer.safetensors")
            torch_checkpoint.from_torch(saved, target, None, step=5)
        trajectory = {f"param.{i}": p.detach().clone() for i, p in enumerate(params)}
        for k in range(5):
            for i, (p, g) in enumerate(zip(params, gradients(generator))):
                p.grad = g
                trajectory[f"grad.{k}.{i}"] = g.clone()
            optimizer.step()
            for i, p in enumerate(params):
                trajectory[f"expected.{k}.{i}"] = p.detach().clone()
        save_file(trajectory, os.path.join(directory, f"{name}.trajectory.safetensors"),
                  metadata={"torch": torch.__version__})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", help="where to write the fixtures (tests/fixtures/torch)")
    parser.add_argument("cases", nargs="*", help="the cases to write (all where none is named)")
    args = parser.parse_args()
    main(args.directory, args.cases)
