"""A model split across GPUs as `from_pretrained(device_map=..., max_memory=...)` splits it,
traced on one CPU: the map is transformers' own (`_get_device_map` on the built model, before
peft wraps it), and accelerate's hooks are emulated so that the tracer sees the copies a
split model makes and can tell each storage's GPU.

Contract: `plan(model, exp)` gives the device map and the GPU of every module object;
`install(model, plan, tracer)` wraps the forward of every module the map names as
accelerate's AlignDevicesHook does (its tensor inputs sent to its GPU: a copy where a tensor
is on another one, whose backward copies the gradient back) and the model's forward as the
hook with io_same_device does (its outputs sent to the GPU of the batch, GPU 0). On the CPU
`.to("cuda:1")` cannot run, so a copy is a `clone()` made while the tracer's `force_device`
names the GPU it lands on. NB: an explicit `.to(x.device)` inside the model's code stays a
no-op, but for the causal-LM loss's labels (emulated): LLaVA's image features are moved to the
embeddings' GPU the same way, which the traced splits keep on one GPU.
"""

from __future__ import annotations

import contextlib
import io
import logging
from typing import Any

import torch

from .tracer import MemoryTracer


def plan(model, exp: dict) -> tuple[dict[str, Any], dict[int, int], dict[str, Any]]:
    """(transformers' device map, id(module) -> GPU for every module of `model`, the module
    objects the map names, "" the model itself)."""
    from transformers.integrations.accelerate import _get_device_map

    value = exp["device_map"]
    memory = dict(enumerate(exp.get("max_memory") or []))
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            device_map = dict(_get_device_map(model, value, memory, None)) if isinstance(value, str) else dict(value)
    finally:
        logging.disable(logging.NOTSET)
    offloaded = sorted(k for k, v in device_map.items() if not isinstance(v, int))
    if offloaded:
        raise ValueError(f"the device map offloads {offloaded[:3]} to {device_map[offloaded[0]]}: not traced")
    gpus: dict[int, int] = {}
    named = dict(model.named_modules())
    objects = {name: named[name] for name in device_map}
    objects[""] = model
    for name, module in model.named_modules():
        best = max((k for k in device_map if k == "" or name == k or name.startswith(k + ".")), key=len, default=None)
        if best is not None:
            gpus[id(module)] = device_map[best]
    return device_map, gpus, objects


def module_gpus(model, placed: dict[int, int]) -> dict[int, int]:
    """GPU of every module of `model` (peft's wrappers take their parent's)."""
    out: dict[int, int] = {}
    by_name: dict[str, int] = {}
    for name, module in model.named_modules():
        gpu = placed.get(id(module))
        if gpu is None:
            gpu = by_name.get(name.rpartition(".")[0], 0)
        by_name[name] = out[id(module)] = gpu
    return out


class _HandOff(torch.autograd.Function):
    """`tensor.to(other GPU)`: a copy there; its backward copies the gradient back."""

    @staticmethod
    def forward(ctx, tensor, gpu: int, source: int, tracer: MemoryTracer):
        ctx.source, ctx.tracer = source, tracer
        return _copy(tensor, gpu, tracer)

    @staticmethod
    def backward(ctx, grad):
        return _copy(grad, ctx.source, ctx.tracer), None, None, None


def _copy(tensor: torch.Tensor, gpu: int, tracer: MemoryTracer) -> torch.Tensor:
    tracer.force_device = gpu
    try:
        return tensor.clone()
    finally:
        tracer.force_device = None


def send(value, gpu: int, tracer: MemoryTracer):
    """accelerate's send_to_device on the emulated GPUs."""
    if isinstance(value, torch.Tensor):
        source = tracer.gpu_of(value)
        if source is None or source == gpu:
            return value
        if value.requires_grad:
            return _HandOff.apply(value, gpu, source, tracer)
        with torch.no_grad():
            return _copy(value, gpu, tracer)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(send(v, gpu, tracer) for v in value)
    if isinstance(value, list):
        return [send(v, gpu, tracer) for v in value]
    if isinstance(value, dict) and type(value) is dict:
        return {k: send(v, gpu, tracer) for k, v in value.items()}
    return value


def install(device_map: dict[str, Any], objects: dict[str, Any], tracer: MemoryTracer):
    """The hooks dispatch_model attaches, on the module objects the map names (taken before
    peft wraps the model, so that its renaming does not matter) and on the model itself; and
    the causal-LM loss's `shift_labels.to(logits.device)` (the labels are padded and shifted on
    the batch's GPU, then copied to the logits' GPU). Returns what undoes the last."""
    for name in device_map:
        if name == "":
            continue
        module = objects[name]
        gpu = device_map[name]
        original = module.forward

        def forward(*args, __original=original, __gpu=gpu, **kwargs):
            return __original(*send(args, __gpu, tracer), **send(kwargs, __gpu, tracer))

        module.forward = forward
    top = objects[""]
    original_top = top.forward

    def top_forward(*args, **kwargs):
        output = original_top(*args, **kwargs)
        # io_same_device: the outputs go back to the GPU of the inputs (the batch's, GPU 0)
        for key in list(output.keys()):
            output[key] = send(output[key], 0, tracer)
        return output

    top.forward = top_forward

    from transformers.loss import loss_utils

    cross_entropy = loss_utils.fixed_cross_entropy

    def fixed_cross_entropy(source, target, *args, **kwargs):
        gpu = tracer.gpu_of(source)
        return cross_entropy(source, send(target, gpu, tracer) if gpu is not None else target, *args, **kwargs)

    loss_utils.fixed_cross_entropy = fixed_cross_entropy

    def undo() -> None:
        loss_utils.fixed_cross_entropy = cross_entropy

    return undo
