#!/usr/bin/env python3
"""Convert optimizer checkpoints between wgpu-optim and PyTorch.

    python3 tools/torch_checkpoint.py to-torch OPTIMIZER.safetensors OUT.pt
    python3 tools/torch_checkpoint.py from-torch IN.pt OUT.safetensors [--optimizer CLASS] [--step N]

`to-torch` writes a `torch.optim` state_dict: `torch.load(OUT.pt)` gives a dict that
`optimizer.load_state_dict` accepts for an optimizer of the saved class (Adam, AdamW, SGD or
Adagrad) over parameters of the saved shapes, in the saved order. The state tensors keep the
shapes the file holds: save with `OptimizerOptions::param_shapes` for parameters that are not
1-D, or PyTorch will refuse the flat states.

`from-torch` writes the reverse: a wgpu-optim checkpoint (`Optimizer::load` reads it) from a
PyTorch state_dict saved with `torch.save(optimizer.state_dict(), IN.pt)`. A state_dict does
not name its class; it is read from the group's keys (AdamW where `decoupled_weight_decay` is
true), or given with `--optimizer`. PyTorch's SGD keeps no step count, only whether a step
was taken (its momentum buffer exists), which is all wgpu-optim's SGD reads from the count:
give `--step N` to record the true count, or step 1 is written.

Needs only `torch` and `safetensors`.
"""

import argparse
import json
import sys

import torch
from safetensors.torch import safe_open, save_file

FORMAT = "wgpu-optim-checkpoint/1"

# The state tensors of each class, under PyTorch's names, in wgpu-optim's order.
STATE_NAMES = {
    "Adam": ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"],
    "AdamW": ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"],
    "SGD": ["momentum_buffer"],
    "Adagrad": ["sum"],
}

# wgpu-optim's hyperparameters of each class (`Algorithm::to_json`), besides `lr`.
OUR_KEYS = {
    "Adam": ["betas", "eps", "weight_decay", "amsgrad", "maximize"],
    "AdamW": ["betas", "eps", "weight_decay", "amsgrad", "maximize"],
    "SGD": ["momentum", "dampening", "weight_decay", "nesterov", "maximize"],
    "Adagrad": ["lr_decay", "weight_decay", "initial_accumulator_value", "eps", "maximize"],
}


def fail(message):
    sys.exit(f"torch_checkpoint: {message}")


def torch_class(name):
    if name not in STATE_NAMES:
        fail(f"unsupported optimizer `{name}` (supported: {', '.join(STATE_NAMES)})")
    return getattr(torch.optim, name)


def default_group(name):
    """Every key the running PyTorch keeps in a group of this class, at its defaults."""
    extra = {"momentum": 0.9} if name == "SGD" else {}
    group = dict(torch_class(name)([torch.zeros(1)], lr=1e-3, **extra).state_dict()["param_groups"][0])
    del group["params"]
    return group


def to_torch(source, target):
    with safe_open(source, "pt") as f:
        metadata = f.metadata() or {}
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    if metadata.get("format") != FORMAT:
        fail(f"{source}: not a wgpu-optim checkpoint (format {metadata.get('format')!r})")
    if metadata.get("rounding", "nearest_even") != "nearest_even":
        fail(f"{source}: {metadata['rounding']} rounding has no PyTorch counterpart")
    if any(key.startswith("master.") for key in tensors):
        fail(f"{source}: master-weight checkpoints keep f32 masters PyTorch has no place for")
    step = float(metadata["step"])
    state, groups = {}, []
    for group in json.loads(metadata["param_groups"]):
        name = group.pop("optimizer")
        params = group.pop("params")
        for i in params:
            entry = {"step": torch.tensor(step, dtype=torch.float32)}
            for state_name in STATE_NAMES[name]:
                key = f"state.{i}.{state_name}"
                if key in tensors:
                    entry[state_name] = tensors[key]
            state[i] = entry
        torch_group = default_group(name)
        for key in ["lr"] + OUR_KEYS[name]:
            torch_group[key] = tuple(group[key]) if key == "betas" else group[key]
        if name == "AdamW" and "decoupled_weight_decay" in torch_group:
            torch_group["decoupled_weight_decay"] = True
        torch_group["params"] = params
        groups.append(torch_group)
    torch.save({"state": state, "param_groups": groups}, target)


def infer_class(group):
    if "betas" in group:
        return "AdamW" if group.get("decoupled_weight_decay") else "Adam"
    if "momentum" in group:
        return "SGD"
    if "lr_decay" in group:
        return "Adagrad"
    fail("cannot tell the optimizer's class from its group's keys; pass --optimizer")


def from_torch(source, target, forced, step=None):
    saved = torch.load(source, weights_only=True)
    tensors, our_groups, steps = {}, [], set()
    for group in saved["param_groups"]:
        name = forced or infer_class(group)
        torch_class(name)
        ours = {"optimizer": name, "lr": float(group["lr"])}
        for key in OUR_KEYS[name]:
            value = group.get(key)
            if value is None:
                fail(f"param group of {name} has no `{key}`")
            ours[key] = [float(b) for b in value] if key == "betas" else value
        if name == "SGD" and group.get("momentum", 0) == 0:
            fail("SGD without momentum keeps no state; wgpu-optim saves none either, nothing to convert")
        ours["params"] = list(group["params"])
        our_groups.append(ours)
        for i in group["params"]:
            entry = saved["state"].get(i, {})
            if "step" in entry:
                steps.add(int(float(entry["step"])))
            for state_name in STATE_NAMES[name]:
                if state_name in entry and entry[state_name] is not None:
                    tensors[f"state.{i}.{state_name}"] = entry[state_name].contiguous()
            tensors[f"state.{i}.step"] = torch.tensor(0.0)
    if len(steps) > 1:
        fail(f"parameters were stepped different numbers of times: {sorted(steps)}")
    if steps:
        counted = steps.pop()
        if step is not None and step != counted:
            fail(f"--step {step}, but the state_dict counts {counted} steps")
        step = counted
    elif step is None:
        # SGD: a buffer means at least one step was taken.
        step = 1 if any(key.endswith(".momentum_buffer") for key in tensors) else 0
    for key in tensors:
        if key.endswith(".step"):
            tensors[key] = torch.tensor(float(step), dtype=torch.float32)
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
    to.add_argument("source")
    to.add_argument("target")
    back = commands.add_parser("from-torch", help="a torch.optim state_dict to a wgpu-optim checkpoint")
    back.add_argument("source")
    back.add_argument("target")
    back.add_argument("--optimizer", choices=sorted(STATE_NAMES), help="the state_dict's class")
    back.add_argument("--step", type=int, help="steps taken, for SGD, whose state_dict keeps none")
    args = parser.parse_args()
    if args.command == "to-torch":
        to_torch(args.source, args.target)
    else:
        from_torch(args.source, args.target, args.optimizer, args.step)


if __name__ == "__main__":
    main()
