"""Stage 5, admit: the resolved setup against what the formulas model. Every refusal of a
setup that is not modelled is made here, after `expand`, which it runs to learn the layer
types a setup reaches; `resolve` only reads and checks the values.

Contract: `admit(doc, spec, setup, overrides, formulas)` returns `setup` when the estimate
models all of it, else raises one `MemspecError` (a `UsageError` when only flags are at
fault) with a diagnostic per refusal, at the experiment's key or the flag that asked for it:
- settings that exclude each other or are measured only apart: activation offloading with
  checkpointing (E315), packing or offloading with images (E316), what the autocast step and
  an older transformers release are not measured with (E325, E331);
- each setup beyond a plain step (`library.formula.SETUPS`) that a formula the spec
  instantiates does not list in its `setups:` (E316, E317, E318, E325, E331): the spec
  expanded for the experiment's batch on one GPU without adapters or quantization (the
  probe), the layers a setup reaches, which tp / pp only split;
- tp / sp / pp with the rest of the setup, and sizes that split evenly (E318, E319);
- parts modelled apart but not together: an optimizer FSDP2's walk does not size (E308),
  peft's modules_to_save or bias with FSDP2, bias with DoRA (E321), a quantized module listed
  as trainable (E307).
The experiment's values are read again as resolve read them (`resolve.Resolution`), so that
each refusal is placed and worded as before. Nothing prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import MemspecError
from ..library.formula import SETUPS, Library
from ..library.shipped import spec_library
from ..paths import data_root
from .expand import expand, experiment_scope
from .load import Document
from .resolve import (
    OLDER_TRANSFORMERS,
    TRANSFORMERS,
    TRANSFORMERS_RELEASE,
    Lora,
    Module,
    Optimizer,
    Resolution,
    Setup,
    Spec,
    _optimizer,
    derive_bytes,
    gpu_catalog,
    release_text,
)


def admit(doc: Document | None, spec: Spec, setup: Setup, overrides: Mapping[str, Any] | None = None, formulas: Library | None = None) -> Setup:
    """`setup` (resolved from `doc` and `overrides`) when every part of it is modelled, else
    the refusals raised together. `formulas`: the library whose `setups:` decide (default:
    the shipped formulas the spec reaches)."""
    r = Resolution(doc, spec, overrides or {})
    data, parallel, complain = r.data, r.parallel, r.complain
    data["transformers"] = setup.transformers  # NB: as resolve's check_knobs read it
    if data.get("activation_offloading") and data["gradient_checkpointing"]:
        complain(
            "activation_offloading",
            "E315",
            "activation offloading together with gradient checkpointing is not modelled",
            "turn one off (gradient_checkpointing: [] or activation_offloading: false)",
        )
    for key in ("packing", "activation_offloading"):
        if data.get(key) and (data["images_per_sample"] or data["videos_per_sample"]):
            complain(
                key,
                "E316",
                f"{key.replace('_', ' ')} is modelled for text-only batches; this experiment has images_per_sample {data['images_per_sample']}"
                + (f" and videos_per_sample {data['videos_per_sample']}" if data["videos_per_sample"] else ""),
                f"set images_per_sample: 0 (a text-only model), or {key}: false",
            )
    if data["precision_mode"] == "autocast":
        _check_autocast(data, parallel, complain)
    if data["transformers"] < OLDER_TRANSFORMERS:
        _check_older_transformers(data, parallel, complain)
    # NB: packing or offloading with images is refused above, whatever the formulas declare
    refused = _check_setups(
        data, parallel, spec, formulas, complain, {"packing", "activation_offloading"} if data["images_per_sample"] or data["videos_per_sample"] else set()
    )
    if not refused & {"tensor_parallel", "sequence_parallel", "pipeline_parallel"}:
        _check_model_parallel(parallel, data, spec, complain)
    _check_pairings(setup, parallel, complain)
    r.raise_problems()
    return setup


def _check_pairings(setup: Setup, parallel: Mapping[str, Any], complain) -> None:
    """Parts each modelled, not together: an optimizer on FSDP2's shards other than the ones its
    walk sizes (E308), peft's modules_to_save or bias with FSDP2 or bias with DoRA (E321), a
    bitsandbytes-quantized module listed as trainable (E307)."""
    optimizer, lora, quantization = setup.optimizer, setup.lora, setup.quantization
    if parallel.get("fsdp") is not None and not _fsdp_modelled(optimizer):
        # NB: the FSDP2 walk sizes states and step temporaries for torch's AdamW/Adam and SGD
        # without weight decay; other optimizers on DTensor shards are not modelled
        complain(
            "optimizer",
            "E308",
            f"optimizer {optimizer.label} is not modelled with FSDP2",
            "use adamw/adam (torch) or sgd without weight decay with FSDP2, or estimate with DeepSpeed ZeRO",
        )
    if lora is not None:
        _check_lora_extras(lora, parallel, complain)
    if quantization is not None:
        trained = sorted(quantization.modules & (frozenset(setup.trainable) - (lora.modules if lora else frozenset())))
        if trained:
            complain(
                "quantization",
                "E307",
                f"module(s) {', '.join(trained)} are quantized and trainable: bitsandbytes' 4-/8-bit weights do not train",
                "adapt them with LoRA (lora: {modules: [...]}) or leave them out of trainable",
            )


def _fsdp_modelled(o: Optimizer) -> bool:
    return not o.bnb and (o.type in ("adamw", "adam") or (o.type == "sgd" and not o.weight_decay))


def _check_lora_extras(lora: Lora, parallel: Mapping[str, Any], complain) -> None:
    """modules_to_save and bias where the estimate does not model them (E321)."""
    extras = [x for x, on in (("modules_to_save", bool(lora.modules_to_save)), (f"bias '{lora.bias}'", lora.bias != "none")) if on]
    if not extras:
        return
    if parallel.get("fsdp") is not None:
        # NB: FSDP2's units hold frozen and trainable parameters of one layer in one flat
        # group; a bias-only or copied layer's reduce-scatter is not walked
        complain(
            "lora", "E321", f"peft {' and '.join(extras)} with FSDP2 is not modelled", "estimate with DeepSpeed ZeRO (parallel: {zero: N}) or without them"
        )
    if lora.use_dora and lora.bias != "none":
        # NB: peft's DoRA layer subtracts and re-adds the base bias around its magnitude scaling
        # (lora/dora.py DoraLinearLayer.forward), a path not in dora_linear's formula
        complain("lora", "E321", f"peft bias '{lora.bias}' with DoRA (use_dora) is not modelled", "use bias: none with use_dora")


# What each of SETUPS is called where an experiment asks for it, and the code of its refusal.
_SETUP_KEYS: Mapping[str, tuple[str, str]] = {
    "packing": ("packing", "E316"),
    "activation_offloading": ("activation_offloading", "E316"),
    "fused_linear_cross_entropy": ("loss", "E317"),
    "tensor_parallel": ("tp", "E318"),
    "sequence_parallel": ("sp", "E318"),
    "pipeline_parallel": ("pp", "E318"),
    "autocast": ("precision", "E325"),
    "older_transformers": ("versions", "E331"),
}
# Setups that change only what a forward holds: a module that runs on no rows (a vision tower
# of a text-only batch) is not concerned. tp / sp / pp also place parameters, which every
# module has.
_RUN_ONLY = frozenset({"packing", "activation_offloading", "fused_linear_cross_entropy"})
_PARALLEL = ("tensor_parallel", "sequence_parallel", "pipeline_parallel")


def wanted_setups(setup_data: Mapping[str, Any], parallel: Mapping[str, Any]) -> tuple[str, ...]:
    """The SETUPS an experiment's values ask for, in SETUPS order."""
    tp, pp = parallel.get("tp", 1), parallel.get("pp", 1)
    on = {
        "packing": bool(setup_data.get("packing")),
        "activation_offloading": bool(setup_data.get("activation_offloading")),
        "fused_linear_cross_entropy": setup_data.get("loss", "cross_entropy") == "fused_linear_cross_entropy",
        "tensor_parallel": tp > 1,
        "sequence_parallel": bool(parallel.get("sp")) and tp > 1,  # NB: sp at tp 1 is E318 of its own
        "pipeline_parallel": pp > 1,
        "autocast": setup_data.get("precision_mode") == "autocast",
        "older_transformers": setup_data.get("transformers", TRANSFORMERS) < OLDER_TRANSFORMERS,
    }
    return tuple(k for k in SETUPS if on[k])


def instantiated_types(spec: Spec, setup: Setup, library: Library) -> dict[str, tuple[dict[str, str], bool]]:
    """Per module of `spec`: {layer type: the first path that instantiates it} under `setup`,
    and whether the module runs on any row (a vision tower of a text-only batch runs on none)."""
    out: dict[str, tuple[dict[str, str], bool]] = {}
    for root in expand(spec, setup, library):
        types: dict[str, str] = {}
        stack, seen = [root], set()
        while stack:
            inst = stack.pop()
            if id(inst) in seen:
                continue
            seen.add(id(inst))
            types.setdefault(inst.formula.layer_type, inst.path)
            stack.extend(reversed(inst.children))
        out[root.module] = (types, bool(root.scope.get("batch", 1)))
    return out


def setup_refusals(
    spec: Spec, setup: Setup, library: Library, wanted: Iterable[str], reached: Mapping[str, tuple[Mapping[str, str], bool]] | None = None
) -> dict[str, tuple[str, str, str]]:
    """For each wanted setup that a formula `spec` instantiates under `setup` does not declare:
    (module, layer type, path of its first instance). A setup that changes only what a
    forward holds (_RUN_ONLY) is not asked of modules that run on no rows, and needs one that
    does. The fused loss also needs a formula that switches to it (its own layer type)."""
    probed = reached is None  # NB: else only the modules' own types, which switch to nothing yet
    if reached is None:
        reached = instantiated_types(spec, setup, library)
    out: dict[str, tuple[str, str, str]] = {}
    for name in wanted:
        running = [m.name for m in spec.modules if m.name in reached and (name not in _RUN_ONLY or reached[m.name][1])]
        if not running:
            out[name] = ("", "", "")
        for module in running:
            # NB: a type the library lacks is the estimate's E301, not a refusal of the setup
            bad = next(((t, path) for t, path in reached[module][0].items() if t in library and name not in library[t].setups), None)
            if bad:
                out[name] = (module, *bad)
                break
        if probed and name == "fused_linear_cross_entropy" and name not in out and not any(name in types for types, _ in reached.values()):
            # NB: the fused loss is a layer that replaces lm_head and the loss; a spec whose
            # formulas never switch to it (no causal LM head) has nothing to fuse
            out[name] = ("", name, "")
    return out


def _runs(module: Module, setup: Setup) -> bool:
    """Whether `module` runs on any row of `setup`'s batch (its context's batch, as expand
    binds it), without instantiating it."""
    scope = {**experiment_scope(setup), **module.inputs}
    try:
        return bool(module.batch(scope))
    except MemspecError:  # NB: a batch expression expand will refuse (E404); count the module as running
        return True


def _check_setups(data: Mapping[str, Any], parallel: Mapping[str, Any], spec: Spec, formulas: Library | None, complain, skip: set[str]) -> set[str]:
    """Refuse each setup beyond a plain step (SETUPS) that a formula the spec instantiates does
    not declare in its `setups:`; returns the refused ones. The formulas are instantiated for
    the experiment's batch, images, loss, packing and offloading on one GPU without LoRA or
    quantization: the layers a setup reaches, which tp / pp only split."""
    wanted = tuple(w for w in wanted_setups(data, parallel) if w not in skip)
    if not wanted or "micro_batch" not in data or "seq_len" not in data:
        return set()
    library = formulas if formulas is not None else spec_library(spec)
    probe = _probe_setup(data, spec)
    try:
        refusals = setup_refusals(spec, probe, library, wanted)
    except MemspecError:
        # NB: inputs the estimate's own expand will refuse: judge the modules' own layer
        # types, the ones known without instantiating anything
        refusals = setup_refusals(spec, probe, library, wanted, reached={m.name: ({m.type: m.name}, _runs(m, probe)) for m in spec.modules})
    flags = [k for k in ("tp", "pp", "sp") if k in data]  # given on the command line
    for name, (module, layer_type, path) in refusals.items():
        key, code = _SETUP_KEYS[name]
        if name in _PARALLEL:
            if any(n in refusals for n in _PARALLEL[: _PARALLEL.index(name)]):
                continue  # NB: one refusal of model parallelism
            key = next((k for k in (key, "tp", "pp") if k in flags), "parallel")
        what, off = _refused(name, key, data)
        if not module and layer_type:
            complain(
                key,
                code,
                f"{what} needs a causal language model head: no formula of {spec.model} ({', '.join(sorted({m.type for m in spec.modules}))}) switches to {layer_type}",
                off,
            )
            continue
        if not module:
            complain(
                key, code, f"{what} is not modelled for {spec.model}: none of its modules ({', '.join(m.name for m in spec.modules)}) runs on this batch", off
            )
            continue
        file = _shown(library[layer_type].file)
        declared = ", ".join(k for k in SETUPS if k in library[layer_type].setups) or "none"
        complain(
            key,
            code,
            f"{what} is not modelled by layer type '{layer_type}' of module '{module}' (first at {path}): {file} does not list {name} under setups (it lists {declared})",
            f"{off}; a formula lists a setup in `setups:` once its figures model it",
        )
    return set(refusals)


def _probe_setup(data: Mapping[str, Any], spec: Spec) -> Setup:
    """The experiment on one GPU without adapters or quantization: what `_check_setups`
    instantiates the formulas for."""
    names = {m.name for m in spec.modules}
    optimizer = _optimizer(data["optimizer"], lambda *a, **k: None)  # NB: its problems are reported already
    values, master, state = derive_bytes(data["precision"], optimizer, data["precision_mode"])
    _, consts = gpu_catalog()
    image_size = tuple(data["image_size"]) if data.get("image_size") else spec.image_size
    return Setup(
        experiment=data.get("experiment", spec.model),
        file=spec.file,
        micro_batch=data["micro_batch"],
        seq_len=data["seq_len"],
        images_per_sample=data["images_per_sample"],
        image_size=image_size,
        anyres=spec.anyres,
        image_resize=spec.image_resize,
        videos_per_sample=data["videos_per_sample"],
        video_frames=data.get("video_frames") or 0,
        video_temporal_patch=spec.video_temporal_patch or 1,
        trainable=frozenset(data["trainable"]) & names,
        precision=data["precision"],
        optimizer=optimizer,
        gradient_checkpointing=frozenset(data["gradient_checkpointing"]) & names,
        attention=data["attention"],
        dp=1,
        zero=0,
        deepspeed=None,
        gpu=None,
        target=consts.default_gpu,
        bytes=values,
        master_bytes=master,
        state_bytes=state,
        loss=data["loss"],
        activation_offloading=bool(data["activation_offloading"]),
        packing=bool(data["packing"]),
        precision_mode=data["precision_mode"],
        transformers=data.get("transformers", TRANSFORMERS),
    )


def _refused(name: str, key: str, data: Mapping[str, Any]) -> tuple[str, str]:
    """(what a refused setup is, in words; how to turn it off, at `key`)."""
    what = SETUPS[name].split(":")[0] if name != "fused_linear_cross_entropy" else "loss fused_linear_cross_entropy"
    if name == "autocast":
        what = f"precision {data.get('precision_given', data['precision'])} as torch.autocast on fp32 weights"
    if name == "older_transformers":
        what = f"transformers {release_text(data['transformers'])}"
    off = {
        "precision": "state a DeepSpeed ZeRO stage (zero: 0 to 3, --zero N, --deepspeed) for 16-bit weights with fp32 master weights, or use bf16-true (pure bf16) or fp32",
        "loss": "use loss: cross_entropy",
        "parallel": "set tp: 1 and pp: 1",
        "versions": f"leave versions.transformers out (the formulas' release, {TRANSFORMERS_RELEASE}) or name 4.49 or later",
        "tp": "set tp: 1",
        "pp": "set pp: 1",
        "sp": "set sp: false",
    }.get(key, f"set {key}: false")
    return what, off


def _check_older_transformers(data: Mapping[str, Any], parallel: Mapping[str, Any], complain) -> None:
    """An older transformers release is measured on a plain step with sdpa (flash_attention_2
    traced as its flash kernel): refuse the rest."""
    release = release_text(data["transformers"])
    others = [SETUPS[k].split(":")[0] for k in wanted_setups(data, parallel) if k != "older_transformers"]
    if data["attention"] == "eager":
        others.insert(0, "eager attention")
    if others:
        complain(
            "versions",
            "E331",
            f"transformers {release} is modelled for a plain step with sdpa or flash_attention_2; not with {', '.join(others)}",
            f"leave versions.transformers out (the formulas' release, {TRANSFORMERS_RELEASE}) or name 4.49 or later",
        )


def _check_autocast(data: Mapping[str, Any], parallel: Mapping[str, Any], complain) -> None:
    """Settings the autocast step is not measured with (specs/matrices/autocast-*.yaml: sdpa,
    unpacked, nothing offloaded, the plain loss, one device's tensors whole, no adapters or
    quantized weights). NB: eager
    attention under autocast keeps fp32 probabilities and a 16-bit copy of them
    (softmax(dtype=fp32).to(query.dtype) with an fp32 query after the fp32 rotary), which
    attention_core does not model."""
    given = data.get("precision_given", data["precision"])
    unmeasured = [
        (key, what)
        for key, on, what in (
            ("attention", data["attention"] == "eager", "eager attention"),
            ("packing", bool(data.get("packing")), "packing"),
            ("activation_offloading", bool(data.get("activation_offloading")), "activation offloading"),
            ("loss", data.get("loss") == "fused_linear_cross_entropy", "loss fused_linear_cross_entropy"),
            ("parallel", parallel["tp"] > 1 or parallel["pp"] > 1, "tensor or pipeline parallelism"),
            # NB: the setups check instantiates the spec without adapters or quantization, so
            # lora_linear, dora_linear and the bitsandbytes linears are refused here
            ("lora", bool(data.get("lora")), "LoRA (peft adapters on frozen fp32 weights)"),
            ("quantization", bool(data.get("quantization")), "bitsandbytes quantization"),
        )
        if on
    ]
    for key, what in unmeasured:
        complain(
            key,
            "E325",
            f"{what} with precision {given} as torch.autocast on fp32 weights is not modelled (measured: full or partial fine-tuning without adapters, sdpa or flash attention, unpacked, nothing offloaded)",
            "state a DeepSpeed ZeRO stage (zero: 0 to 3, --zero N) for 16-bit weights with fp32 master weights, or use bf16-true or fp32",
        )


def _shown(file: str) -> str:
    """A formula file as a refusal names it: a bundled one by its place in the package's data
    (formulas/<type>.yaml), wherever the command runs; another as given."""
    try:
        return str(Path(file).resolve().relative_to(data_root().resolve()))
    except ValueError:
        return file


def _check_model_parallel(parallel: Mapping[str, Any], data: Mapping[str, Any], spec: Spec, complain) -> None:
    """Tensor / sequence / pipeline parallelism: what is modelled, and sizes that split evenly."""
    tp, pp, sp = parallel["tp"], parallel["pp"], parallel["sp"]
    flags = [k for k in ("tp", "pp", "sp") if k in data]  # given on the command line

    def at(*keys: str) -> str:
        return next((k for k in keys if k in flags), "parallel")

    if tp == 1 and pp == 1:
        if sp:
            complain(at("sp", "tp"), "E318", "sequence parallelism (sp) splits activations by tp, and tp is 1", "set tp > 1, or sp: false")
        return
    # NB: which layers tp / pp split is the formulas' `setups:` (_check_setups); these are
    # the other parts of a setup that no formula models together with model parallelism
    why = None
    if data.get("lora"):
        why = "LoRA or DoRA"
    elif (data.get("quantization") or {}).get("bits"):
        why = "bitsandbytes quantization"
    elif data.get("activation_offloading") or data.get("packing"):
        why = "activation offloading or packing"
    elif parallel.get("fsdp") is not None or parallel.get("zero"):  # NB: --fsdp alone is {}
        why = "FSDP2 or ZeRO sharding"
    if why:
        complain(
            at("tp", "pp"),
            "E318",
            f"tensor / pipeline parallelism (tp {tp}, pp {pp}) is modelled for a text-only Llama-style causal LM without {why}",
            "set tp: 1 and pp: 1",
        )
        return
    for m in spec.modules:
        for key, degree in (("n_heads", tp), ("n_kv_heads", tp), ("intermediate", tp), ("n_layers", pp)):
            if key in m.inputs and m.inputs[key] % degree:
                complain(
                    at("pp" if key == "n_layers" else "tp"),
                    "E319",
                    f"{'tp' if key != 'n_layers' else 'pp'} {degree} does not divide {key} {m.inputs[key]} of module '{m.name}'",
                    "Megatron splits heads and the MLP evenly across tensor ranks, and layers evenly across pipeline stages",
                )
