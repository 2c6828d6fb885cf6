"""Formula examples: each formula file's `examples:` evaluated and compared.

Contract: `run_examples(library)` evaluates every example of every formula (a composite with
its whole subtree) and returns a diagnostic per expected number that differs, located at the
example's `expect` key. Context defaults: bf16 mixed precision with AdamW (bytes.param 2,
grad 2, optim 12, act 2), sdpa attention, one image per sample, not trainable, no gradient
from upstream. An example's `context.bytes` overrides single sizes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..errors import Diagnostic, MemspecError
from ..pipeline.evaluate import evaluate
from ..pipeline.expand import _Expansion, _instance
from .formula import Example, Formula, Library
from ..pipeline.load import child_path
from ..pipeline.resolve import TRANSFORMERS, Anyres, Optimizer, Setup, derive_bytes, gpu_catalog

DEFAULT_CONTEXT: Mapping[str, Any] = {
    "batch": 1,
    "seq": 1,
    "trainable": False,
    "grad_in": False,
    "attention": "sdpa",
    "images": 1,
    "image_h": 0,
    "image_w": 0,
    "grid_rows": 0,
    "grid_cols": 0,
    "checkpointing": False,
    "videos": 0,
    "video_frames": 0,
    "micro_batch": 1,
    "target_len": 0,
    "fused_loss": False,
    "offloading": False,
    "autocast": False,
    "packed": False,
    "cudnn_attention": True,  # the catalog's default GPU, an H100 (sm90)
    "bias_trains": False,
    "transformers": TRANSFORMERS,
}


def _target(context: Mapping[str, Any]):
    """The GPU an example runs on: the catalog's default (an H100), or with cudnn_attention
    false an sm80 card (an A100), whose sdpa does not prefer cuDNN attention."""
    gpus, consts = gpu_catalog()
    if context.get("cudnn_attention", True):
        return consts.default_gpu
    return next(g for g in gpus.values() if g.arch == "sm80")


def example_setup(context: Mapping[str, Any]) -> Setup:
    mode = "autocast" if context.get("autocast") else ""
    values, master, state = derive_bytes("bf16-mixed", Optimizer("adamw", "foreach", 0.0), mode)
    values = {**values, **(context.get("bytes") or {})}
    return Setup(
        experiment="example",
        file="",
        micro_batch=context.get("micro_batch", 1),
        seq_len=1,
        images_per_sample=context.get("images", 1),
        videos_per_sample=context.get("videos", 0),
        video_frames=context.get("video_frames", 0),
        target_len=context.get("target_len", 0),
        image_size=(context["image_h"], context["image_w"]) if context.get("image_h") else None,
        trainable=frozenset(),
        precision="bf16-mixed",
        optimizer=Optimizer("adamw", "foreach", 0.0),
        gradient_checkpointing=frozenset(),
        attention=context.get("attention", "sdpa"),
        dp=1,
        zero=0,
        deepspeed=None,
        gpu=None,
        target=_target(context),
        bytes=values,
        master_bytes=master,
        state_bytes=state,
        # NB: an example names its anyres tile grid directly: one pinpoint of rows x cols 1-px tiles
        anyres=Anyres(1, ((context["grid_rows"], context["grid_cols"]),)) if context.get("grid_rows") else None,
        loss="fused_linear_cross_entropy" if context.get("fused_loss") else "cross_entropy",
        activation_offloading=bool(context.get("offloading")),
        packing=bool(context.get("packed")),
        tp=context.get("tp", 1),
        sp=bool(context.get("sp")),
        pp=context.get("pp", 1),
        precision_mode=mode,
        transformers=context.get("transformers", TRANSFORMERS),
    )


def evaluate_example(library: Library, formula: Formula, example: Example, expansion: _Expansion | None = None) -> dict[str, int]:
    """The numbers an example's `expect` may name, for this formula and its subtree;
    `expansion`: one shared by the examples of a library (its memo answers the repeats)."""
    ctx = {**DEFAULT_CONTEXT, **example.context}
    setup = example_setup(ctx)

    def locate(key, message, help):
        path = child_path(child_path(example.path, "inputs"), key) if key else example.path
        return formula.doc.diag("E407", path, message, help)

    inst = _instance(
        expansion or _Expansion(library),
        formula,
        path=formula.layer_type,
        template=formula.layer_type,
        index=(),
        module=formula.layer_type,
        given=example.inputs,
        tensors={},
        setup=setup,
        batch=ctx["batch"],
        seq=ctx["seq"],
        trainable=ctx["trainable"],
        grad_in=ctx["grad_in"],
        reaches_loss=True,
        checkpointing=ctx["checkpointing"],
        checkpointed=False,
        locate=locate,
        # NB: `bias_trains` in an example's context: peft's bias option reaches this (frozen) layer
        bias_ok=bool(ctx["bias_trains"]),
    )
    (root,) = evaluate((inst,))
    out = {"parameters": 0, "gradients": 0, "optimizer_states": 0, "buffers": 0}
    saved: dict[str, int] = {}
    for n in root.walk():
        for k in out:
            out[k] += getattr(n.cost, k)
        for name, size in n.cost.saved:
            saved.setdefault(name, size)
    out["activations"] = sum(saved.values())
    out["transient_forward"] = root.cost.transient_forward
    out["transient_backward"] = root.cost.transient_backward
    return out


def run_examples(library: Library) -> list[Diagnostic]:
    # NB: one expansion for this library's examples: its memo is keyed by layer type, so another
    # library's 'linear' never answers for this one's
    expansion = _Expansion(library)
    problems: list[Diagnostic] = []
    for formula in library.formulas.values():
        for example in formula.examples:
            try:
                got = evaluate_example(library, formula, example, expansion)
            except MemspecError as exc:
                # NB: an evaluation error is located at the expression; say which inputs made it
                problems.extend(replace(d, message=f"{d.message} (in example '{example.name}')") if d.code == "E404" else d for d in exc.diagnostics)
                continue
            for key, want in example.expect.items():
                if got[key] != want:
                    problems.append(
                        formula.doc.diag(
                            "E407",
                            child_path(child_path(example.path, "expect"), key),
                            f"example '{example.name}': {key} is {got[key]:_}, expected {want:_} (off by {got[key] - want:+_})",
                            "fix the formula, or the example's arithmetic",
                        )
                    )
    return problems
