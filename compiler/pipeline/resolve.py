"""Stage 3, resolve: a validated model spec and experiment (plus command-line overrides) become
the frozen `Spec` and `Setup` (vocabulary.py) with every default filled and every byte size
derived, each value checked on its own; whether the formulas model the setup is decided by
`admit`, a later stage (resolve runs no formula).

Contract: `resolve_spec(doc)` turns a validated spec document into a `Spec` (`checked_spec(path)`:
a spec file's, kept in the checked-input cache);
`resolve_setup(doc, spec, overrides)` turns an experiment document (or none, for a bare spec)
and the overrides into a `Setup`. Precision and optimizer reach formulas only through
`Setup.bytes`; nothing later in the pipeline looks at the precision name again except to
print it. Problems are raised together as one `MemspecError`. The vocabulary it builds is
vocabulary.py's (with gpus.py and zero_config.py), re-exported here; `device_map` and
`max_memory` are read by placement.py.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Mapping

from .. import checked
from ..errors import Diagnostic, MemspecError, UsageError, did_you_mean
from ..library.expr_python import FUNCTIONS
from ..library.formula import compile_expr
from .load import Document, child_path
from .validate import checked_document
from .placement import read_device_map
from ..memory.allocator import AllocConfError, AllocatorConfig
from ..memory import optimizers
from ..memory.optimizers import TYPE_IMPLS, Optimizer

# The vocabulary, re-exported: callers take it from resolve (the GPU catalog of gpus.py and
# DeepSpeed's buffers of zero_config.py with it).
from .vocabulary import FIXED_DTYPE_BYTES, FP32_BYTES, PRECISIONS, PRECISION_NAMES, PRECISION_MODES, MIXED_PRECISIONS, ATTENTION, LOSSES, DEFAULTS  # noqa: F401
from .vocabulary import EXPERIMENT_NAMES, SGD_DEFAULT_MOMENTUM, Module, Anyres, ImageResize, Spec, VisionChunk, Fsdp, FSDP_REDUCE_BYTES, FSDP_DEFAULTS  # noqa: F401
from .vocabulary import fsdp_setup, LORA_DEFAULTS, Lora, QUANTIZATION_DEFAULTS, Quantization, Setup, vision_items, precision_mode, derive_bytes  # noqa: F401
from .vocabulary import TRANSFORMERS, TRANSFORMERS_RELEASE, OLDER_TRANSFORMERS, UNMODELLED_TRANSFORMERS, release_code, release_text, DeviceMap  # noqa: F401
from .vocabulary import DEVICE_MAP_STRATEGIES  # noqa: F401
from .gpus import KIB, MIB, Gpu, SIZE_UNITS, _SIZE, SIZE_HELP, parse_size, Margin, parse_margin, DeviceConstants, Constant, _catalog, _per_arch  # noqa: F401
from .gpus import gpu_catalog, find_gpu, catalog_constants  # noqa: F401
from .zero_config import DeepSpeed, DEEPSPEED_DEFAULT_REDUCE_BUCKET, DEEPSPEED_DEFAULT_PREFETCH_BUCKET, DEEPSPEED_DEFAULT_PERSISTENCE  # noqa: F401
from .zero_config import DEEPSPEED_DEFAULT_MAX_LIVE, DEEPSPEED_DEFAULT_REUSE_DISTANCE, DEEPSPEED_DEFAULT_SUB_GROUP, HF_AUTO_PREFETCH_FRACTION  # noqa: F401
from .zero_config import HF_AUTO_PERSISTENCE_FACTOR, DEEPSPEED_STATES_AT_INIT, ZERO12_ALIGNMENT, COMM_BYTES, _AUTO_KEYS, deepspeed_buffers  # noqa: F401
from .zero_config import offload_problem, deepspeed_constants  # noqa: F401


def resolve_spec(doc: Document) -> Spec:
    data = doc.data
    problems: list[Diagnostic] = []
    modules = []
    for name, m in data["modules"].items():
        path = child_path("$.modules", name)
        inputs = dict(m["inputs"])
        declared = frozenset(EXPERIMENT_NAMES | {k for k, v in inputs.items() if isinstance(v, int)})
        ctx = m["context"]
        modules.append(
            Module(
                name=name,
                type=m["type"],
                inputs=inputs,
                batch=compile_expr(ctx["batch"], doc, child_path(child_path(path, "context"), "batch"), declared, problems),
                seq=compile_expr(ctx["seq"], doc, child_path(child_path(path, "context"), "seq"), declared, problems),
                parameters=m["parameters"],
                path=path,
            )
        )
    names = {m.name for m in modules}
    for i, name in enumerate(data.get("lora_trainable") or ()):
        if name not in names:
            problems.append(
                doc.diag(
                    "E304",
                    child_path("$.lora_trainable", i),
                    f"unknown module '{name}'",
                    did_you_mean(name, sorted(names)) or f"modules: {', '.join(sorted(names))}",
                )
            )
    if problems:
        raise MemspecError(problems)
    return Spec(
        model=data["model"],
        file=doc.file,
        source=dict(data.get("source") or {}),
        image_tokens=data.get("image_tokens", 0),
        hidden_size=data.get("hidden_size"),
        modules=tuple(modules),
        image_size=tuple(data["image_size"]) if data.get("image_size") else None,
        anyres=Anyres(data["anyres"]["tile"], tuple(tuple(p) for p in data["anyres"]["grid_pinpoints"])) if data.get("anyres") else None,
        image_resize=ImageResize(**data["image_resize"]) if data.get("image_resize") else None,
        context_length=data.get("context_length"),
        lora_trainable=tuple(data.get("lora_trainable") or ()),
        video_temporal_patch=data.get("video_temporal_patch"),
        vision_chunk=VisionChunk(**data["vision_chunk"]) if data.get("vision_chunk") else None,
        attention=tuple(data.get("attention") or ()),
        encoder_decoder=bool(data.get("encoder_decoder")),
        doc=doc,
    )


def checked_spec(path: str | os.PathLike) -> Spec:
    """A model spec file loaded, validated and resolved, through the checked-input cache
    (`compiler.checked`)."""
    file = os.fspath(path)
    raw = checked.read(file)
    name = checked.key("spec", file, raw) if raw is not None else None
    hit = checked.get(name) if name else None
    if isinstance(hit, Spec):
        return hit
    value = resolve_spec(checked_document(file, "spec"))
    if name:
        checked.put(name, value)
    return value


# transformers examples/pytorch/summarization/run_summarization.py: max_target_length's default
DEFAULT_TARGET_LEN = 128


def _check_target(data: dict, spec: Spec, complain) -> None:
    """target_len (the decoder's positions) belongs to an encoder-decoder spec, which takes
    run_summarization's default when the experiment gives none; any other model is refused."""
    if spec.encoder_decoder:
        data.setdefault("target_len", DEFAULT_TARGET_LEN)
    elif data.get("target_len") is not None:
        complain(
            "target_len",
            "E333",
            f"{spec.model} is no encoder-decoder model: target_len {data['target_len']} would size a decoder it does not have",
            "leave target_len out: seq_len is the whole sequence of a decoder-only model (prompt and answer together)",
        )


def _image_pieces(chunk: VisionChunk, image_size: tuple[int, int] | None) -> tuple[int, int, int]:
    """(h, w, pieces): the image the processor cuts (the spec's scale without a size) and the
    source image plus its slices, each a piece the tower reads."""
    h, w = image_size or (chunk.scale, chunk.scale)
    return h, w, 1 + FUNCTIONS["slice_count"](h, w, chunk.scale, chunk.max_slices)


def vision_chunk_micro_batch(spec: Spec, images_per_sample: int, image_size: tuple[int, int] | None) -> int | None:
    """The largest micro-batch whose slices the tower runs at once (MiniCPM-V 2.6's
    vision_batch_size: more is refused, E725), or None where nothing bounds it."""
    chunk = spec.vision_chunk
    if chunk is None or not images_per_sample:
        return None
    return chunk.slices // (images_per_sample * _image_pieces(chunk, image_size)[2])


def _check_vision_chunk(data: Mapping[str, Any], spec: Spec, image_size: tuple[int, int] | None, complain) -> None:
    """E725: more slices in the micro-batch than the tower runs at once (MiniCPM-V 2.6's
    get_vllm_embedding then runs it in chunks of vision_batch_size, which is not modelled)."""
    chunk = spec.vision_chunk
    if chunk is None or not data["images_per_sample"] or "micro_batch" not in data:
        return
    h, w, pieces = _image_pieces(chunk, image_size)
    slices = data["micro_batch"] * data["images_per_sample"] * pieces
    if slices > chunk.slices:
        per_image = f"its source image and {pieces - 1} slices" if pieces > 1 else "one slice, unsliced"
        complain(
            "image_size" if data.get("image_size") else "micro_batch",
            "E725",
            f"{spec.model}'s tower runs at most {chunk.slices} slices at once (vision_batch_size) and the micro-batch has {slices} "
            f"({data['micro_batch']} x {data['images_per_sample']} image(s) of {h} x {w}, each {per_image}): the chunked tower is not modelled",
            f"give at most {chunk.slices} slices a micro-batch: a smaller micro_batch or image_size",
        )


def _check_video(data: Mapping[str, Any], spec: Spec, complain) -> None:
    """Videos need a model that reads them (the spec's video_temporal_patch) and a frame count;
    a frame count needs videos."""
    videos, frames = data["videos_per_sample"], data.get("video_frames")
    if videos and spec.video_temporal_patch is None:
        complain(
            "videos_per_sample",
            "E327",
            f"{spec.model} takes no video input: its spec has no video_temporal_patch",
            "leave videos_per_sample out, or estimate a model that reads videos (Qwen2-VL, Qwen2.5-VL)",
        )
    elif videos and not frames:
        complain(
            "videos_per_sample",
            "E328",
            f"videos_per_sample {videos} without video_frames: a video's memory follows its frame count",
            "give video_frames (the frames sampled per video), e.g. --video-frames 16",
        )
    elif frames and not videos:
        complain(
            "video_frames",
            "E328",
            f"video_frames {frames} without videos: videos_per_sample is 0",
            "give videos_per_sample (e.g. --videos-per-sample 1), or leave video_frames out",
        )


def _check_compile(data: Mapping[str, Any], complain) -> None:
    """torch_compile (TrainingArguments' --torch_compile): inductor's fused kernels and its
    min-cut partitioner choose which activations to save and which to recompute, unlike the
    eager step every formula describes; refused until a compiled step is measured."""
    if data.get("torch_compile"):
        complain(
            "torch_compile",
            "E329",
            "torch_compile: a compiled step saves other activations than the eager one (inductor fuses kernels and its partitioner recomputes some), and no compiled step is measured yet",
            "estimate the eager step (leave torch_compile out); the compiled step's memory is not modelled",
        )


def resolve_setup(doc: Document | None, spec: Spec, overrides: Mapping[str, Any] | None = None) -> Setup:
    """The experiment in `doc` (None for a bare spec) with `overrides` applied on top.

    Overrides come from the command line and are already typed; their errors are located
    at the flag (`path` "--flag") rather than in a file. Whether the formulas model the
    setup is the next stages' question (`admit.admit`).
    """
    r = Resolution(doc, spec, overrides or {})
    optimizer, alloc_conf = r.check_knobs()
    image_size = r.check_media()
    _check_compile(r.data, r.complain)
    gpu, margin, consts = r.gpu_and_margin(alloc_conf)
    deepspeed = r.check_deepspeed()
    device_map = r.check_device_map()
    r.raise_problems()
    lora, quantization = r.peft()
    r.raise_problems()
    data, parallel, file = r.data, r.parallel, r.file
    values, master, state = derive_bytes(data["precision"], optimizer, data["precision_mode"])
    return Setup(
        experiment=data.get("experiment", spec.model),
        file=file,
        micro_batch=data["micro_batch"],
        seq_len=data["seq_len"],
        images_per_sample=data["images_per_sample"],
        videos_per_sample=data["videos_per_sample"],
        video_frames=data.get("video_frames") or 0,
        target_len=data.get("target_len") or 0,
        video_temporal_patch=spec.video_temporal_patch or 1,
        image_size=image_size,
        anyres=spec.anyres,
        image_resize=spec.image_resize,
        # NB: peft freezes every base weight of the modules it adapts
        trainable=frozenset(data["trainable"]) - (lora.modules if lora else frozenset()),
        precision=data["precision"],
        optimizer=optimizer,
        gradient_checkpointing=frozenset(data["gradient_checkpointing"]) | self_checkpointed(spec),
        attention=data["attention"],
        dp=parallel["dp"],
        zero=parallel["zero"],
        deepspeed=deepspeed,
        gpu=gpu,
        target=gpu or consts.default_gpu,
        bytes=values,
        master_bytes=master,
        state_bytes=state,
        lora=lora,
        fsdp=fsdp_setup(parallel.get("fsdp"), data["precision"]),
        quantization=quantization,
        # NB: peft's get_peft_model calls enable_input_require_grads() when the model has
        # gradient checkpointing on (PeftModel._prepare_model_for_gradient_checkpointing).
        input_require_grads=data.get("input_require_grads", bool(lora and data["gradient_checkpointing"])),
        loss=data["loss"],
        activation_offloading=bool(data["activation_offloading"]),
        packing=bool(data["packing"]),
        tp=parallel["tp"],
        sp=bool(parallel["sp"]),
        pp=parallel["pp"],
        alloc_conf=alloc_conf,
        margin=margin,
        precision_mode=data["precision_mode"],
        transformers=data["transformers"],
        device_map=device_map,
    )


# Root layer types whose remote code checkpoints every decoder layer itself, whatever the setting:
# CogVLM2's llm_forward calls torch.utils.checkpoint.checkpoint(..., use_reentrant=False) per
# layer (and transformers' gradient_checkpointing_enable refuses the model). Their modules are
# checkpointed in every estimate. CogVLM's (v1) llm_forward, the same layer type, does not: its
# spec says self_checkpointed false.
SELF_CHECKPOINTED = ("cogvlm_causal_lm",)


def self_checkpointed(spec: Spec) -> frozenset[str]:
    return frozenset(m.name for m in spec.modules if m.type in SELF_CHECKPOINTED and not _off(m.inputs.get("self_checkpointed", True)))


def _off(value: Any) -> bool:
    return str(value).lower() == "false"


def never_checkpointed(spec: Spec) -> bool:
    """CogVLM (v1): the remote code checkpoints nothing itself and declares
    supports_gradient_checkpointing False, so transformers' gradient_checkpointing_enable refuses
    the whole model (E336 for any gradient_checkpointing)."""
    return any(m.type in SELF_CHECKPOINTED and _off(m.inputs.get("self_checkpointed", True)) for m in spec.modules)


class Resolution:
    """One experiment being resolved: its values merged from the defaults, the file and the
    flags (`data`, `parallel`), and the problems found so far, each at the key or flag that
    set it."""

    def __init__(self, doc: Document | None, spec: Spec, overrides: Mapping[str, Any]):
        self.doc, self.spec = doc, spec
        self.problems: list[Diagnostic] = []
        data = dict(DEFAULTS)
        # NB: mixed precision is DeepSpeed's master weights where DeepSpeed is stated: a ZeRO stage
        # in the experiment or on the command line, or a DeepSpeed config
        deepspeed_stated = any(k in (overrides or {}) for k in ("deepspeed", "zero")) or (doc is not None and "zero" in (doc.data.get("parallel") or {}))
        precision_stated = "precision" in (overrides or {}) or (doc is not None and "precision" in doc.data)
        data["trainable"] = [m.name for m in spec.modules]
        # NB: a text-only model's batch has no image unless the experiment says so
        data["images_per_sample"] = 1 if spec.image_tokens else 0
        if doc is not None:
            data.update(doc.data)
        overrides = dict(overrides or {})
        parallel = dict(DEFAULTS["parallel"])
        parallel.update(data.get("parallel") or {})
        if "deepspeed" in overrides:
            # NB: a DeepSpeed config replaces the experiment's DeepSpeed keys as a whole: what it
            # leaves out takes DeepSpeed's defaults, not the experiment's values
            parallel = {k: parallel[k] for k in ("dp", "zero", "tp", "pp", "sp")} | overrides.pop("deepspeed")
        for key in ("dp", "zero"):
            if key in overrides:
                parallel[key] = overrides.pop(key)
        if "fsdp" in overrides:
            # NB: --fsdp-* flags change single keys of the experiment's fsdp block; None turns it off
            fsdp_flags = overrides.pop("fsdp")
            parallel["fsdp"] = None if fsdp_flags is None else {**(parallel.get("fsdp") or {}), **fsdp_flags}
            fsdp_from_flags = True
        else:
            fsdp_from_flags = False
        for key in ("tp", "pp", "sp", "offload_optimizer", "offload_param"):
            # NB: kept in `overrides` so that a problem with them is shown at the flag
            if key in overrides:
                parallel[key] = overrides[key]
        lora_flags = set(overrides["lora"]) if overrides.get("lora") is not None else set()
        if overrides.get("lora") is not None:
            # NB: --lora-* flags change single keys of the experiment's lora block; None turns it off
            overrides["lora"] = {**(data.get("lora") or {}), **overrides["lora"]}
        if "param_groups" in overrides:
            # NB: --param-groups changes one key of the optimizer block, whichever optimizer it is
            groups = overrides.pop("param_groups")
            if "optimizer" in overrides:
                overrides["optimizer"] = {**overrides["optimizer"], "param_groups": groups}
            else:
                data["optimizer"] = {**data["optimizer"], "param_groups": groups}
        if spec.attention and "attention" not in overrides and (doc is None or "attention" not in doc.data):
            # NB: an experiment that names no implementation gets the one transformers picks
            data["attention"] = spec.attention[0]
        stated = "trainable" in overrides or (doc is not None and "trainable" in doc.data)
        if "versions" in overrides:
            # NB: --transformers-version changes one key of the experiment's versions block
            overrides["versions"] = {**(data.get("versions") or {}), **overrides["versions"]}
        data.update(overrides)
        if data.get("lora") and not stated:
            # NB: peft's get_peft_model freezes every base weight; the spec names what the
            # model's own LoRA recipe trains in full besides (LLaVA: the projector)
            data["trainable"] = list(spec.lora_trainable)
        data["parallel"] = parallel
        file = doc.file if doc is not None else spec.file
        data["precision_given"] = data["precision"]
        data["precision"] = PRECISION_NAMES.get(data["precision"], data["precision"])
        data["precision_mode"] = precision_mode(
            data["precision"],
            data.get("precision_mode"),
            deepspeed_stated=deepspeed_stated,
            precision_stated=precision_stated,
            fsdp=parallel.get("fsdp") is not None,
        )

        self.data, self.overrides, self.parallel, self.file = data, overrides, parallel, file
        self.fsdp_from_flags, self.lora_flags = fsdp_from_flags, lora_flags
        self.module_names = [m.name for m in spec.modules]

    def where(self, key: str) -> tuple[str, str]:
        """(file, path) of a key: the flag when overridden, else the experiment's key."""
        if key in self.overrides:
            return "", FLAGS.get(key, "--" + key.replace("_", "-"))
        return self.file, "$." + key

    def complain(self, key: str, code: str, message: str, help: str | None = None, index: int | None = None):
        f, p = self.where(key)
        if f and self.doc is not None:
            target = p if index is None else child_path(p, index)
            self.problems.append(self.doc.diag(code, target, message, help))
        else:
            self.problems.append(Diagnostic(code, f, 0, 0, p, message, help))

    def raise_problems(self) -> None:
        if self.problems:
            # NB: problems only with flags are the command line's: exit 2, as argparse's own are
            raise (UsageError if all(not d.file for d in self.problems) else MemspecError)(self.problems)

    def check_knobs(self) -> tuple[Optimizer, AllocatorConfig]:
        """The knobs one by one: present, known modules, the optimizer, the release, the allocator's settings, the kernel."""
        data, parallel, spec = self.data, self.parallel, self.spec
        doc, complain, problems = self.doc, self.complain, self.problems
        module_names, fsdp_from_flags = self.module_names, self.fsdp_from_flags
        for key in ("micro_batch", "seq_len"):
            if key not in data:
                complain(key, "E201", f"missing {key.replace('_', '-')}", f"give --{key.replace('_', '-')} N or use an experiment file")
        for key in ("trainable", "gradient_checkpointing"):
            for i, name in enumerate(data.get(key) or ()):
                if name not in module_names:
                    complain(
                        key, "E304", f"unknown module '{name}'", did_you_mean(name, module_names) or f"modules of {spec.model}: {', '.join(module_names)}", i
                    )
        if data.get("gradient_checkpointing") and never_checkpointed(spec):
            complain(
                "gradient_checkpointing",
                "E336",
                f"{spec.model} cannot be checkpointed: its remote code checkpoints no layer and declares supports_gradient_checkpointing False, so transformers' gradient_checkpointing_enable refuses the model",
                "leave gradient_checkpointing unset (the model's own step keeps every activation)",
            )
        optimizer = _optimizer(data["optimizer"], complain)
        data["transformers"] = _transformers(data.get("versions") or {}, complain)
        try:
            alloc_conf = AllocatorConfig.parse(data.get("alloc_conf") or "")
        except AllocConfError as error:
            complain("alloc_conf", "E330", f"PYTORCH_CUDA_ALLOC_CONF: {error}", error.help)
            alloc_conf = AllocatorConfig()
        if spec.attention and data["attention"] not in spec.attention:
            complain(
                "attention",
                "E714",
                f"{spec.model} does not run with attention '{data['attention']}' in transformers",
                f"it takes {', '.join(spec.attention)} ({spec.attention[0]} by default; the spec's attention list in {spec.file})",
            )
        if parallel.get("fsdp") is not None and parallel["zero"] > 0:
            if fsdp_from_flags or "zero" not in (doc.data.get("parallel") or {} if doc is not None else {}):
                problems.append(
                    Diagnostic(
                        "E310",
                        "",
                        0,
                        0,
                        "--fsdp",
                        f"FSDP and DeepSpeed ZeRO stage {parallel['zero']} both shard the model; a run uses one",
                        "drop --zero (or the DeepSpeed config), or drop --fsdp",
                    )
                )
            else:
                problems.append(
                    doc.diag(
                        "E310",
                        "$.parallel",
                        f"fsdp and zero {parallel['zero']} both shard the model; a run uses one",
                        "remove `zero` for FSDP2, or `fsdp` for DeepSpeed",
                    )
                )
        if parallel["zero"] > 0 and parallel["dp"] == 1:
            pass  # NB: ZeRO at dp 1 shards nothing; allowed, it is what single-GPU DeepSpeed runs do
        return optimizer, alloc_conf

    def check_media(self) -> tuple[int, int] | None:
        """The images and videos against the model and the sequence; the image size in use."""
        data, spec, complain = self.data, self.spec, self.complain
        image_size = tuple(data["image_size"]) if data.get("image_size") else spec.image_size
        if not spec.image_tokens and data["images_per_sample"]:
            complain(
                "images_per_sample",
                "E324",
                f"{spec.model} has no vision tower: images_per_sample {data['images_per_sample']} would count images a text-only model never reads",
                "leave images_per_sample out (0 for a text-only model), or estimate a multimodal spec",
            )
        _check_video(data, spec, complain)
        _check_target(data, spec, complain)
        if spec.image_resize is not None and image_size is not None and max(image_size) > ImageResize.MAX_ASPECT * min(image_size):
            complain(
                "image_size",
                "E724",
                f"{spec.model}'s processor refuses an image of {image_size[0]} x {image_size[1]}: its aspect ratio is above {ImageResize.MAX_ASPECT} (smart_resize)",
                "give the image size the batches really have",
            )
        _check_vision_chunk(data, spec, image_size, complain)
        if spec.anyres is not None and image_size is None and data["images_per_sample"] > 0:
            complain(
                "image_size",
                "E717",
                f"{spec.model} tiles each image (anyres): its tile grid and image tokens depend on the image size, and neither the spec nor the experiment gives one",
                "set image_size: [height, width] in the experiment or the spec, or pass --image-size HxW",
            )
        # NB: spec.image_tokens is for the spec's own image size; a native-resolution tower at
        # another size has its token count in the formulas only, so the check needs the default.
        # NB: a tiled spec's images take more than the base image's tokens: the formulas' count
        # (E723) checks them at every size, LLaVA-NeXT-Video's frames at their pooled count
        if "micro_batch" in data and "seq_len" in data and image_size == spec.image_size and spec.anyres is None:
            # NB: videos on a model that takes none are refused above (E327), not counted here
            items = vision_items(
                data["images_per_sample"],
                data["videos_per_sample"] if spec.video_temporal_patch else 0,
                data.get("video_frames") or 0,
                spec.video_temporal_patch or 1,
            )
            need = items * spec.image_tokens
            if data["seq_len"] < need:
                what = (
                    f"{data['images_per_sample']} x {spec.image_tokens}"
                    if items == data["images_per_sample"]
                    else f"{items} images and temporal patches x {spec.image_tokens}"
                )
                complain(
                    "seq_len",
                    "E501",
                    f"seq_len {data['seq_len']} is shorter than the image tokens it must hold ({what} = {need})",
                    "seq_len counts the LLM positions of the text and the image tokens together",
                )
        return image_size

    def gpu_and_margin(self, alloc_conf: AllocatorConfig) -> tuple[Gpu | None, Margin, DeviceConstants]:
        """The GPU asked about and the margin a verdict keeps (`alloc_conf`: check_knobs')."""
        data, complain = self.data, self.complain
        gpu = None
        gpus, consts = gpu_catalog()
        if data.get("gpu"):
            found = find_gpu(str(data["gpu"]), gpus, consts)
            if isinstance(found, Gpu):
                gpu = found
            else:
                complain("gpu", *found)
        margin = consts.margin_for(bool(data.get("gradient_checkpointing")), data.get("attention"), alloc_conf.only_expandable, bool(data.get("packing")))
        if data.get("margin") is not None:
            try:
                margin = parse_margin(str(data["margin"]))
            except ValueError as error:
                complain(
                    "margin",
                    "E506",
                    f"'{data['margin']}' is not a margin: {error}",
                    "write a percentage of the GPU's memory, e.g. 5%, or a size, e.g. 2GiB (2^30 bytes) or 2GB (10^9 bytes)",
                )
        if (margin.percent or 0) >= 100 or (gpu is not None and margin.reserve(gpu.memory) >= gpu.memory):
            whole = f"{gpu.key}'s {gpu.memory / 2**30:.2f} GiB" if gpu is not None else "the GPU"
            complain("margin", "E204", f"a margin of {margin.text} leaves nothing of {whole}", "keep less free, e.g. --margin 5%")
        return gpu, margin, consts

    def check_deepspeed(self) -> DeepSpeed | None:
        """DeepSpeed's buffers, and the offload settings they cannot take."""
        parallel, spec, overrides, complain = self.parallel, self.spec, self.overrides, self.complain
        deepspeed, problem = deepspeed_buffers(parallel, spec.hidden_size)
        if problem:
            # NB: an offload problem is shown at --offload-optimizer / --offload-param when one gave it
            flag = (
                next(
                    (k for k in (("offload_optimizer", "offload_param") if problem[0] == "E311" else ("offload_param", "offload_optimizer")) if k in overrides),
                    None,
                )
                if problem[0] in ("E311", "E806", "E807")
                else None
            )
            complain(flag or "parallel", problem[0], problem[1], problem[2])
        return deepspeed

    def check_device_map(self) -> DeviceMap | None:
        """`device_map` and `max_memory` (`placement.read_device_map`), located at the key or flag."""
        file, base = self.where("device_map")
        return read_device_map(self.data, self.parallel, self.complain, file, base, self.doc)

    def peft(self) -> tuple[Lora | None, Quantization | None]:
        """The LoRA and quantization blocks, their modules known."""
        data, spec, doc = self.data, self.spec, self.doc
        complain, module_names, lora_flags, file = self.complain, self.module_names, self.lora_flags, self.file
        lora = _lora(data.get("lora"))
        for name in sorted(lora.modules) if lora else ():
            if name not in module_names:
                complain("lora", "E304", f"unknown module '{name}'", did_you_mean(name, module_names) or f"modules of {spec.model}: {', '.join(module_names)}")
        if lora is not None:
            lora = _lora_located(lora, lora_flags, file, doc)
        quantization = _quantization(data.get("quantization"))
        if quantization is not None:
            for name in sorted(quantization.modules):
                if name not in module_names:
                    complain(
                        "quantization",
                        "E304",
                        f"unknown module '{name}'",
                        did_you_mean(name, module_names) or f"modules of {spec.model}: {', '.join(module_names)}",
                    )
        return lora, quantization


# Flags whose key in the experiment is spelled otherwise
FLAGS: Mapping[str, str] = {"versions": "--transformers-version"}


def _transformers(versions: Mapping[str, Any], complain) -> int:
    """The release code of the experiment's versions.transformers (TRANSFORMERS without one)."""
    text = versions.get("transformers")
    if text is None:
        return TRANSFORMERS
    code = release_code(str(text))
    if code is None:
        complain(
            "versions",
            "E331",
            f"versions.transformers '{text}' is not a release",
            f"write major.minor.patch as pip shows it, e.g. 4.46.3 (the formulas' own: {TRANSFORMERS_RELEASE})",
        )
        return TRANSFORMERS
    for first, end, why in UNMODELLED_TRANSFORMERS:
        if first <= code < end:
            complain(
                "versions",
                "E331",
                f"transformers {release_text(code)} is not modelled: {why}",
                f"name 4.43 or later ({TRANSFORMERS_RELEASE}, the formulas' own, by default)",
            )
            return TRANSFORMERS
    return code


def _lora_located(lora: Lora, flags: set, file: str, doc) -> Lora:
    """`lora` with the place of each modules_to_save name and of `bias`: the flag, else the
    experiment's key."""

    def at(key: str, flag: str, index: int | None = None) -> tuple[str, int, int, str]:
        if key in flags:
            return ("", 0, 0, flag)
        if doc is None or key not in (doc.data.get("lora") or {}):
            return (file, 0, 0, f"$.lora.{key}")
        path = f"$.lora.{key}" if index is None else child_path(f"$.lora.{key}", index)
        line, col = doc.where(path)
        return (file, line, col, path)

    return replace(
        lora, saves_at=tuple(at("modules_to_save", "--lora-modules-to-save", i) for i in range(len(lora.modules_to_save))), bias_at=at("bias", "--lora-bias")
    )


def _quantization(block: Mapping[str, Any] | None) -> Quantization | None:
    """The experiment's `quantization` block with BitsAndBytesConfig's defaults (None: none)."""
    if not block or not block.get("bits"):
        return None
    b = {**QUANTIZATION_DEFAULTS, **block}
    return Quantization(int(b["bits"]), b["quant_type"], bool(b["double_quant"]), frozenset(b["modules"]), tuple(b["skip_modules"]))


def _optimizer(opt: Mapping[str, Any], complain) -> Optimizer:
    """The experiment's `optimizer` block, each option checked against its type."""
    kind = opt["type"]
    impls = TYPE_IMPLS[kind]
    impl = opt.get("impl", impls[0])
    if impl not in impls:
        complain("optimizer", "E305", f"{kind} has no '{impl}' implementation here", f"{kind} runs as: {', '.join(impls)}")
        impl = impls[0]
    bnb = impl == "bitsandbytes"
    for key, ok, need in (
        ("bits", bnb, "impl: bitsandbytes"),
        ("paged", bnb, "impl: bitsandbytes"),
        ("momentum", kind in ("sgd", "adafactor"), "type sgd (momentum) or adafactor (beta1)"),
    ):
        if key in opt and not ok:
            complain("optimizer", "E305", f"optimizer option '{key}' does not apply to {kind} {impl}", f"'{key}' needs {need}")
    default_momentum = SGD_DEFAULT_MOMENTUM if kind == "sgd" else 0.0
    groups = opt.get("param_groups", "one")
    if groups not in optimizers.PARAM_GROUPS:
        complain(
            "optimizer",
            "E305",
            f"param_groups {groups!r} is not one of {', '.join(optimizers.PARAM_GROUPS)}",
            "one: every tensor in one group (an optimizer on model.parameters()); trainer: Hugging Face Trainer's weight-decay and no-decay groups",
        )
        groups = "one"
    return Optimizer(
        kind,
        impl,
        float(opt.get("momentum", default_momentum)),
        float(opt.get("weight_decay", 0.0)),
        int(opt.get("bits", 32)),
        bool(opt.get("paged", False)),
        groups,
    )


def _lora(block: Mapping[str, Any] | None) -> Lora | None:
    """The experiment's `lora` block with peft's defaults filled (None: no LoRA)."""
    if not block:
        return None
    b = {**LORA_DEFAULTS, **block}
    targets = b["target_modules"]
    targets = "all-linear" if targets == "all-linear" else tuple([targets] if isinstance(targets, str) else targets)
    return Lora(int(b["r"]), b["alpha"], float(b["dropout"]), targets, frozenset(b["modules"]), tuple(b["modules_to_save"]), b["bias"], bool(b["use_dora"]))


def with_overrides(setup: Setup, **changes: Any) -> Setup:
    """A copy of `setup` with knobs changed; bytes re-derived when precision or optimizer move."""
    out = replace(setup, **changes)
    if out.precision not in MIXED_PRECISIONS or (out.mode not in ("autocast", "master-weights", "fsdp-policy")):
        out = replace(out, precision_mode="")  # NB: a precision changed from or to an unmixed one
    values, master, state = derive_bytes(out.precision, out.optimizer, out.mode)
    return replace(out, bytes=values, master_bytes=master, state_bytes=state)
