#!/usr/bin/env python3
"""Convert optimizer checkpoints between wgpu-optim and PyTorch.

    python3 tools/torch_checkpoint.py to-torch OPTIMIZER.safetensors OUT.pt
    python3 tools/torch_checkpoint.py from-torch IN.pt OUT.safetensors [--optimizer CLASS] [--step N]

`to-torch` writes a `torch.optim` state_dict: `torch.load(OUT.pt)` gives a dict that
`optimizer.load_state_dict` accepts for an optimizer of the saved class (Adam, AdamW, SGD,
Adagrad, RMSprop or Adafactor) over parameters of the saved shapes, in the saved order
(parameters are numbered across groups, as PyTorch numbers them). The state tensors keep the
shapes the file holds: build the wgpu-optim optimizer with `OptimizerOptions::param_shapes`
for parameters that are not 1-D, or PyTorch's step fails on the flat states. Group keys that
wgpu-optim does not have (`foreach`, `fused`, `capturable`, `differentiable`, ...) get the
running PyTorch's defaults. Checkpoints with master weights, Kahan compensation or
stochastic rounding have no PyTorch counterpart and are refused.

`from-torch` writes the reverse: a wgpu-optim checkpoint (`Optimizer::load` and
`CpuOptimizer::load` read it) from a PyTorch state_dict saved with
`torch.save(optimizer.state_dict(), IN.pt)`, every state in its parameter's shape (the
optimizer that loads it is built with `param_shapes`, or with none). A state_dict does not
name its class; it is read from the group's keys (AdamW where `decoupled_weight_decay` is
true), or given with `--optimizer`. PyTorch's SGD keeps no step count, only whether a step
was taken (its momentum buffer exists), which is all wgpu-optim's SGD reads from the count:
give `--step N` to record the true count, or step 1 is written (0 for SGD without
momentum, which keeps no state at all and only carries its hyperparameters over).

Needs only `torch` and `safetensors`.
"""

import argparse
import json
import sys

import torch
from safetensors.torch import safe_open, save_file

# The format written here: version 1, without the per-tensor CRC-32s (`crc32` metadata) that
# version 2 adds; the crate loads both.
FORMAT = "wgpu-optim-checkpoint/1"
READABLE_FORMATS = (FORMAT, "wgpu-optim-checkpoint/2")
CLASSES = ["Adam", "AdamW", "SGD", "Adagrad", "RMSprop", "Adafactor"]

# wgpu-optim's hyperparameters of each class besides `lr`: the keys `Algorithm::from_json`
# reads, under PyTorch's names.
OUR_KEYS = {
    "Adam": ["betas", "eps", "weight_decay", "amsgrad", "maximize"],
    "AdamW": ["betas", "eps", "weight_decay", "amsgrad", "maximize"],
    "SGD": ["momentum", "dampening", "weight_decay", "nesterov", "maximize"],
    "Adagrad": ["lr_decay", "weight_decay", "initial_accumulator_value", "eps", "maximize"],
    "RMSprop": ["alpha", "eps", "weight_decay", "momentum", "centered", "maximize"],
    "Adafactor": ["beta2_decay", "eps", "d", "weight_decay", "maximize"],
}

# Adafactor's state of a parameter of two or more dimensions (factored), and of a vector.
FACTORED = ["row_var", "col_var"]
UNFACTORED = ["variance"]


def fail(message):
    sys.exit(f"torch_checkpoint: {message}")


def torch_class(name):
    if name not in CLASSES:
        fail(f"unsupported optimizer `{name}` (supported: {', '.join(CLASSES)})")
    return getattr(torch.optim, name)


def default_group(name):
    """Every key the running PyTorch keeps in a group of this class, at its defaults."""
    extra = {"momentum": 0.9} if name == "SGD" else {}
    group = dict(torch_class(name)([torch.zeros(1)], lr=1e-3, **extra).state_dict()["param_groups"][0])
    del group["params"]
    return group


def state_names(name, group, held):
    """The state tensors a parameter of this group keeps after a step, in wgpu-optim's order;
    `held` (the names the file holds for it) tells Adafactor's factored state from a vector's."""
    if name == "Adafactor":
        return FACTORED if set(FACTORED) & set(held) else UNFACTORED
    if name in ("Adam", "AdamW"):
        return ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])
    if name == "SGD":
        return ["momentum_buffer"] if group["momentum"] != 0 else []
    if name == "RMSprop":
        # PyTorch keeps the buffer only for momentum > 0 and grad_avg only when centered.
        return (["square_avg"] + (["momentum_buffer"] if group["momentum"] > 0 else [])
                + (["grad_avg"] if group["centered"] else []))
    return ["sum"]


def to_torch(source, target):
    with safe_open(source, "pt") as f:
        metadata = f.metadata() or {}
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    if metadata.get("format") not in READABLE_FORMATS:
        fail(f"{source}: not a wgpu-optim checkpoint (format {metadata.get('format')!r})")
    if metadata.get("rounding", "nearest_even") != "nearest_even":
        fail(f"{source}: {metadata['rounding']} rounding has no PyTorch counterpart")
    if any(key.startswith("master.") for key in tensors):
        fail(f"{source}: master-weight checkpoints keep f32 masters PyTorch has no place for")
    if "q8_min_8bit_size" in metadata:
        fail(f"{source}: blockwise 8-bit state (bitsandbytes' state1/absmax1/qmap1) has no torch.optim "
             "counterpart; it is a bitsandbytes 8-bit optimizer's state")
    step = int(metadata["step"])
    state, groups = {}, []
    for group in json.loads(metadata["param_groups"]):
        name = group.pop("optimizer")
        params = group.pop("params")
        torch_group = default_group(name)
        for key in ["lr"] + OUR_KEYS[name]:
            # torch keeps Adam's betas and Adafactor's (eps1 or None, eps2) as tuples.
            pair = key == "betas" or (name == "Adafactor" and key == "eps")
            torch_group[key] = tuple(group[key]) if pair else group[key]
        if name == "AdamW" and "decoupled_weight_decay" in torch_group:
            torch_group["decoupled_weight_decay"] = True
        torch_group["params"] = params
        groups.append(torch_group)
        for i in params:
            # SGD keeps no step; before its first step it has no buffer either (PyTorch's
            # first step sets the buffer to the gradient, which a zero buffer would not).
            entry = {} if name == "SGD" else {"step": torch.tensor(float(step), dtype=torch.float32)}
            if name != "SGD" or step > 0:
                held = [key.split(".", 2)[2] for key in tensors if key.startswith(f"state.{i}.")]
                for state_name in state_names(name, group, held):
                    entry[state_name] = tensors[f"state.{i}.{state_name}"]
            if entry:
                state[i] = entry
    torch.save({"state": state, "param_groups": groups}, target)


def infer_class(group):
    """The supported class whose group has exactly these keys (older PyTorch: a subset)."""
    keys = set(group) - {"params"}
    for name in ("Adam", "SGD", "Adagrad", "RMSprop", "Adafactor"):
        if set(["lr"] + OUR_KEYS[name]) <= keys <= set(default_group(name)):
            return "AdamW" if name == "Adam" and group.get("decoupled_weight_decay") else name
    fail(f"a param group with keys {sorted(keys)} is none of {', '.join(CLASSES)}; "
         "pass --optimizer if it is one of them")


def from_torch(source, target, forced, step=None):
    saved = torch.load(source, weights_only=True)
    tensors, our_groups, steps = {}, [], set()
    for g, group in enumerate(saved["param_groups"]):
        name = forced or infer_class(group)
        torch_class(name)
        ours = {"optimizer": name, "lr": float(group["lr"])}
        for key in OUR_KEYS[name]:
            value = group.get(key)
            if value is None:
                fail(f"param_groups[{g}] ({name}) has no `{key}`")
            if key == "betas":
                value = [float(b) for b in value]
            elif name == "Adafactor" and key == "eps":
                value = [None if e is None else float(e) for e in value]
            ours[key] = value
        ours["params"] = list(group["params"])
        our_groups.append(ours)
        for i in group["params"]:
            entry = saved["state"].get(i, {})
            expected = state_names(name, ours, entry)
            if not entry and expected:
                fail(f"parameter {i} has no state: PyTorch creates it at the first step that gives "
                     "the parameter a gradient; convert after a step that updated every parameter")
            unknown = set(entry) - set(expected) - {"step"}
            if unknown:
                fail(f"parameter {i} keeps {sorted(unknown)}, which {name} as wgpu-optim runs it does not")
            for state_name in expected:
                if entry.get(state_name) is None:
                    fail(f"parameter {i} has no `{state_name}`, which {name} keeps")
                tensors[f"state.{i}.{state_name}"] = entry[state_name].contiguous()
            if "step" in entry:
                steps.add(int(float(entry["step"])))
    if len(steps) > 1:
        fail(f"parameters were stepped different numbers of times: {sorted(steps)}")
    if steps:
        counted = steps.pop()
        if step is not None and step != counted:
            fail(f"--step {step}, but the state_dict counts {counted} steps")
        step = counted
    elif step is None:
        # SGD: a momentum buffer means at least one step was taken; without momentum the
        # count changes nothing.
        step = 1 if tensors else 0
    for group in our_groups:
        for i in group["params"]:
            tensors[f"state.{i}.step"] = torch.tensor(float(step), dtype=torch.float32)
    metadata = {
        "format": FORMAT,
        "step": str(step),
        "param_groups": json.dumps(our_groups),
        "rounding": "nearest_even",
    }
    save_file(tensors, target, metadata=metadata)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    to = commands.add_parser("to-torch", help="a wgpu-optim checkpoint to a torch.optim state_dict")
    to.add_argument("source", help="a checkpoint written by Optimizer::save or CpuOptimizer::save")
    to.add_argument("target", help="the .pt file to write")
    back = commands.add_parser("from-torch", help="a torch.optim state_dict to a wgpu-optim checkpoint")
    back.add_argument("source", help="torch.save(optimizer.state_dict(), ...)'s file")
    back.add_argument("target", help="the .safetensors file to write")
    back.add_argument("--optimizer", choices=CLASSES, help="the state_dict's class, if its keys do not tell")
    back.add_argument("--step", type=int, help="steps taken, for SGD, whose state_dict keeps none")
    args = parser.parse_args()
    if args.command == "to-torch":
        to_torch(args.source, args.target)
    else:
        from_torch(args.source, args.target, args.optimizer, args.step)


if __name__ == "__main__":
    main()
