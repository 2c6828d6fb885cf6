"""Read experiment files and measurement matrices into plain, fully defaulted mappings.

Contract: `load_experiment(path)` returns the experiment as a dict with every default filled,
`model` resolved to the model spec's path and `config` to its Hugging Face config.json;
`expand_matrix(path)` returns (record name, experiment) pairs for every combination of a
matrix file's axes, in the order the file lists them. `to_record(exp)` is the mapping a
record stores (the spec path relative to the repository root, no absolute paths). Pure
YAML and path handling: no torch here, so the CLI can import this to build its parser.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml

from ..memory.allocator import AllocConfError, AllocatorConfig
from ..pipeline.vocabulary import LORA_DEFAULTS


MODULES = ("vision", "qformer", "projector", "language")  # qformer: BLIP-2's Q-Former and its queries
PRECISIONS = ("bf16", "bf16-mixed", "fp16-mixed", "fp32")
ATTENTIONS = ("flash_attention_2", "sdpa", "eager")
OPTIMIZER_TYPES = ("adamw", "adam", "sgd", "adafactor")
OPTIMIZER_IMPLS = ("foreach", "fused", "forloop")
OPTIMIZER_KEYS = ("type", "impl", "momentum", "weight_decay", "param_groups")
PARAM_GROUPS = ("one", "trainer")

DEFAULTS: dict[str, Any] = {
    "images_per_sample": 1,
    "trainable": ["projector", "language"],
    "precision": "bf16-mixed",
    "optimizer": {"type": "adamw", "impl": "foreach"},
    "gradient_checkpointing": [],
    "attention": "sdpa",
    "parallel": {"dp": 1, "zero": 0},
}
# Keys a record keeps, in this order; descriptive keys pass through when present.
MEASURED_KEYS = (
    "experiment",
    "model",
    "micro_batch",
    "seq_len",
    "images_per_sample",
    "trainable",
    "precision",
    "optimizer",
    "gradient_checkpointing",
    "attention",
    "parallel",
)
# Measured keys only some families have; a record keeps them when present.
OPTIONAL_KEYS = (
    "target_len",
    "image_size",
    "videos_per_sample",
    "video_frames",
    "lora",
    "loss",
    "packing",
    "activation_offloading",
    "precision_mode",
    "versions",
    "device_map",
    "max_memory",
    "alloc_conf",
)
# Libraries whose release an experiment may name (`versions: {transformers: 4.46.3}`): the
# measurement runs only under that release (the record's own `versions` say what ran).
VERSIONED = ("transformers",)
# How a 16-bit mixed precision runs: absent, DeepSpeed's fp32 master weights of 16-bit weights
# (the harness's mixed precision since the first record); autocast, HF Trainer / accelerate's
# torch.autocast around the forward of an fp32 model.
PRECISION_MODES = ("autocast", "master-weights")
# Lightning's precision names, measured as the older ones records carry (compiler/pipeline/
# resolve.py PRECISION_NAMES; pure fp16, "16-true", is not measured)
PRECISION_NAMES = {"bf16-true": "bf16", "16-mixed": "fp16-mixed", "32-true": "fp32", "32": "fp32"}
LOSSES = ("cross_entropy", "fused_linear_cross_entropy")
# peft's LoraConfig defaults for what an experiment's `lora` block leaves out: the estimator's
# (pipeline/vocabulary.py), so that a record's experiment and its estimate read one set
LORA_BIAS = ("none", "all", "lora_only")
# FSDP2 (torch.distributed.fsdp.fully_shard) defaults for what `parallel.fsdp` leaves out:
# fully_shard's reshard_after_forward=True; gradients reduced in fp32 (MixedPrecisionPolicy
# reduce_dtype), the full-precision dtype the sharded parameters keep.
FSDP_DEFAULTS: dict[str, Any] = {"reshard_after_forward": True, "reduce_dtype": "fp32"}
FSDP_REDUCE_DTYPES = ("fp32", "bf16", "fp16")
DESCRIPTIVE_KEYS = ("summary", "gpu", "notes")
# Forward order of the modules; a module gets gradients flowing through it when it or
# anything before it is trainable.
FORWARD_ORDER = MODULES


class ExperimentError(ValueError):
    """An experiment or matrix file that cannot be measured; the message says why."""


def _read_yaml(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as exc:
        raise ExperimentError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ExperimentError(f"{path}: not valid YAML: {exc}") from exc


def model_config_path(spec_path: Path) -> Path:
    """The Hugging Face config.json a model spec names in `source.config`."""
    spec = _read_yaml(spec_path)
    try:
        config = spec["source"]["config"]
    except (TypeError, KeyError) as exc:
        raise ExperimentError(f"{spec_path}: model spec has no source.config") from exc
    return (spec_path.parent / config).resolve()


def _check(exp: dict, where: str) -> None:
    def fail(message: str) -> None:
        raise ExperimentError(f"{where}: {message}")

    for key in ("micro_batch", "seq_len"):
        if not isinstance(exp.get(key), int) or exp[key] < 1:
            fail(f"{key} must be a positive integer, got {exp.get(key)!r}")
    for key in ("trainable", "gradient_checkpointing"):
        unknown = sorted(set(exp[key]) - set(MODULES))
        if unknown:
            fail(f"{key}: unknown module(s) {unknown}; known: {list(MODULES)}")
    has = _spec_modules(Path(exp["model"]))
    for key in ("trainable", "gradient_checkpointing"):
        absent = [m for m in exp[key] if m in MODULES and m not in has]
        if has and absent:
            fail(f"{key}: the model ({Path(exp['model']).name}) has no module(s) {absent}; it has {list(has)}")
    if exp["precision"] not in PRECISIONS:
        fail(f"precision {exp['precision']!r} is not one of {list(PRECISIONS)}")
    mode = exp.get("precision_mode")
    if mode is not None and mode not in PRECISION_MODES:
        fail(f"precision_mode {mode!r} is not one of {list(PRECISION_MODES)}")
    if mode == "autocast" and exp["precision"] != "bf16-mixed":
        fail(f"precision_mode autocast is measured with precision bf16-mixed, got {exp['precision']!r} (16-mixed adds the GradScaler's steps, not traced)")
    if mode == "autocast" and exp["parallel"].get("fsdp") is not None:
        fail("precision_mode autocast with FSDP2 is not measured: FSDP2's MixedPrecisionPolicy casts the weights itself")
    if exp["attention"] not in ATTENTIONS:
        fail(f"attention {exp['attention']!r} is not one of {list(ATTENTIONS)}")
    _check_optimizer(exp["optimizer"], fail)
    if not isinstance(exp["images_per_sample"], int) or exp["images_per_sample"] < 0:
        fail(f"images_per_sample must be a non-negative integer, got {exp['images_per_sample']!r}")
    if exp.get("target_len") is not None and (not isinstance(exp["target_len"], int) or exp["target_len"] < 1):
        fail(f"target_len must be a positive integer, got {exp['target_len']!r}")
    for key in ("videos_per_sample", "video_frames"):
        if exp.get(key) is not None and (not isinstance(exp[key], int) or exp[key] < 0):
            fail(f"{key} must be a non-negative integer, got {exp[key]!r}")
    if bool(exp.get("videos_per_sample")) != bool(exp.get("video_frames")):
        fail("videos_per_sample and video_frames go together (videos of that many frames)")
    lora = exp.get("lora")
    if lora is not None:
        _check_lora(lora, fail)
    if exp["parallel"].get("fsdp") is not None:
        _check_fsdp(exp["parallel"], fail)
    bits = (exp.get("quantization") or {}).get("bits", 16)
    if bits != 16:
        fail(
            f"quantization bits {bits}: bitsandbytes' 4-/8-bit layers need CUDA and real tensors and cannot run on fake "
            "tensors (the estimate pins them to bitsandbytes' source: formulas/linear_4bit.yaml, linear_8bit.yaml)"
        )
    if exp.get("loss") is not None and exp["loss"] not in LOSSES:
        fail(f"loss {exp['loss']!r} is not one of {list(LOSSES)}")
    for key in ("packing", "activation_offloading"):
        if exp.get(key) is not None and not isinstance(exp[key], bool):
            fail(f"{key} must be true or false, got {exp[key]!r}")
    if exp.get("activation_offloading") and exp["gradient_checkpointing"]:
        fail("activation_offloading with gradient_checkpointing is not measured (nor estimated)")
    for key in ("packing", "activation_offloading"):
        if exp.get(key) and exp["images_per_sample"]:
            fail(f"{key} is measured for text-only batches (images_per_sample 0)")
    _check_versions(exp.get("versions"), fail)
    _check_alloc_conf(exp.get("alloc_conf"), fail)
    size = exp.get("image_size")
    if size is not None and not (isinstance(size, list) and len(size) == 2 and all(isinstance(x, int) and x > 0 for x in size)):
        fail(f"image_size must be [height, width] in pixels, got {size!r}")


def _check_optimizer(optimizer: dict, fail) -> None:
    if optimizer.get("type") not in OPTIMIZER_TYPES:
        fail(f"optimizer.type {optimizer.get('type')!r} is not one of {list(OPTIMIZER_TYPES)}")
    if optimizer.get("impl", "foreach") not in OPTIMIZER_IMPLS:
        fail(
            f"optimizer.impl {optimizer.get('impl')!r} is not one of {list(OPTIMIZER_IMPLS)}"
            + (" (bitsandbytes needs CUDA and real tensors: it cannot run on fake tensors)" if optimizer.get("impl") == "bitsandbytes" else "")
        )
    unknown = sorted(set(optimizer) - set(OPTIMIZER_KEYS))
    if unknown:
        fail(f"optimizer: unknown key(s) {unknown}; measurable: {list(OPTIMIZER_KEYS)}")
    if optimizer.get("param_groups", "one") not in PARAM_GROUPS:
        fail(f"optimizer.param_groups {optimizer.get('param_groups')!r} is not one of {list(PARAM_GROUPS)}")


def _check_fsdp(parallel: dict, fail) -> None:
    fsdp = parallel["fsdp"]
    unknown = sorted(set(fsdp) - set(FSDP_DEFAULTS))
    if unknown:
        fail(f"parallel.fsdp: unknown key(s) {unknown}; known: {list(FSDP_DEFAULTS)}")
    if not isinstance(fsdp["reshard_after_forward"], bool):
        fail(f"parallel.fsdp.reshard_after_forward must be true or false, got {fsdp['reshard_after_forward']!r}")
    if fsdp["reduce_dtype"] not in FSDP_REDUCE_DTYPES:
        fail(f"parallel.fsdp.reduce_dtype {fsdp['reduce_dtype']!r} is not one of {list(FSDP_REDUCE_DTYPES)}")
    if parallel.get("zero", 0):
        fail("parallel: fsdp and a ZeRO stage exclude each other (one shards the model)")


def _check_versions(versions: Any, fail) -> None:
    if versions is None:
        return
    if not isinstance(versions, dict) or sorted(set(versions) - set(VERSIONED)):
        fail(f"versions must map {list(VERSIONED)} to a release, got {versions!r}")
    for name, release in versions.items():
        if not isinstance(release, str):
            fail(f"versions.{name} must be a release string such as '4.46.3', got {release!r}")


def _check_alloc_conf(text: Any, fail) -> None:
    """PYTORCH_CUDA_ALLOC_CONF as the step runs under it (the estimate's replay reads the same)."""
    if text is None:
        return
    if not isinstance(text, str):
        fail(f"alloc_conf must be PYTORCH_CUDA_ALLOC_CONF's text such as 'expandable_segments:True', got {text!r}")
    try:
        AllocatorConfig.parse(text)
    except AllocConfError as exc:
        fail(f"alloc_conf: {exc}" + (f" ({exc.help})" if exc.help else ""))


def check_installed(exp: dict) -> None:
    """Refuse an experiment that names a library release other than the one installed: the
    trace is of the code that runs (install that release to measure it)."""
    from importlib.metadata import version

    for name, release in (exp.get("versions") or {}).items():
        if version(name) != release:
            raise ExperimentError(
                f"experiment {exp['experiment']!r} names {name} {release}; {version(name)} is installed "
                f"(measure it with {name}=={release} installed, e.g. on PYTHONPATH)"
            )


def _check_lora(lora: dict, fail) -> None:
    unknown = sorted(set(lora) - set(LORA_DEFAULTS))
    if unknown:
        fail(f"lora: unknown key(s) {unknown}; known: {list(LORA_DEFAULTS)}")
    if not isinstance(lora["r"], int) or lora["r"] < 1:
        fail(f"lora.r must be a positive integer, got {lora['r']!r}")
    if not 0 <= lora["dropout"] < 1:
        fail(f"lora.dropout must be in [0, 1), got {lora['dropout']!r}")
    if lora["bias"] not in LORA_BIAS:
        fail(f"lora.bias {lora['bias']!r} is not one of {list(LORA_BIAS)}")
    unknown = sorted(set(lora["modules"]) - set(MODULES))
    if unknown:
        fail(f"lora.modules: unknown module(s) {unknown}; known: {list(MODULES)}")


def normalise_parallel(parallel: dict) -> dict:
    """The `parallel` block with its defaults; an `fsdp` block gets FSDP_DEFAULTS filled."""
    out = {**DEFAULTS["parallel"], **parallel}
    if out.get("fsdp") is not None:
        out["fsdp"] = {**FSDP_DEFAULTS, **out["fsdp"]}
    return out


def normalise_lora(lora: dict | None) -> dict | None:
    """The experiment's `lora` block with peft's defaults filled (None: no LoRA)."""
    if lora is None:
        return None
    out = {**LORA_DEFAULTS, **lora}
    if isinstance(out["target_modules"], str) and out["target_modules"] != "all-linear":
        out["target_modules"] = [out["target_modules"]]
    return out


def check_measurable(exp: dict) -> None:
    """Refuse what one process cannot measure: ZeRO sharding, and data parallelism other
    than FSDP2 (which runs as rank 0 of a fake process group); and a library release other
    than the installed one."""
    check_installed(exp)
    parallel = exp["parallel"]
    if parallel.get("fsdp") is not None and parallel.get("zero", 0) == 0:
        return
    if parallel.get("dp", 1) != 1 or parallel.get("zero", 0) != 0:
        raise ExperimentError(
            f"experiment {exp['experiment']!r}: parallel {exp['parallel']} cannot be measured here: "
            "only dp 1, zero 0 runs on one process (the CLI's --no-parallel measures it unsharded)"
        )


def normalise(raw: dict, base_dir: Path, where: str) -> dict:
    """Fill defaults and resolve `model` (relative to `base_dir`); check every field."""
    if not isinstance(raw, dict):
        raise ExperimentError(f"{where}: an experiment must be a mapping")
    missing = [k for k in ("experiment", "model", "micro_batch", "seq_len") if k not in raw]
    if missing:
        raise ExperimentError(f"{where}: missing required key(s) {missing}")
    spec_path = (base_dir / raw["model"]).resolve()
    modules = _spec_modules(spec_path)
    # NB: as the estimator defaults them: every module of the spec trains; images only where
    # the model has a vision tower
    exp = {**DEFAULTS, "trainable": list(modules), "images_per_sample": 1 if "vision" in modules else 0, **raw}
    exp["optimizer"] = {**({"impl": "foreach"} if exp["optimizer"].get("type", "adamw") in ("adamw", "adam") else {}), **exp["optimizer"]}
    exp["parallel"] = normalise_parallel(exp["parallel"])
    exp["precision"] = PRECISION_NAMES.get(exp["precision"], exp["precision"])
    stated = raw.get("parallel") or {}
    if (
        "precision" in raw
        and exp["precision"] in ("bf16-mixed", "fp16-mixed")
        and "precision_mode" not in raw
        and "zero" not in stated
        and stated.get("fsdp") is None
    ):
        # NB: as the estimator reads the same file (resolve.precision_mode): a mixed precision
        # stated without a ZeRO stage is autocast on fp32 weights
        exp["precision_mode"] = "autocast"
    exp["trainable"] = list(exp["trainable"])
    exp["gradient_checkpointing"] = list(exp["gradient_checkpointing"])
    exp["lora"] = normalise_lora(exp.get("lora"))
    exp["model"] = spec_path
    exp["config"] = model_config_path(spec_path)
    if exp.get("image_size") is None:
        # NB: a native-resolution spec names the image size its image_tokens are for
        exp["image_size"] = (_read_yaml(spec_path) or {}).get("image_size")
    _check(exp, where)
    return exp


def _spec_modules(spec_path: Path) -> tuple[str, ...]:
    """The modules (vision, projector, language) the model spec declares, in forward order."""
    spec = _read_yaml(spec_path) if spec_path.is_file() else None
    declared = (spec or {}).get("modules") or {}
    return tuple(m for m in MODULES if m in declared)


def load_experiment(path: str | Path) -> dict:
    path = Path(path)
    return normalise(_read_yaml(path), path.parent, str(path))


def with_overrides(exp: dict, **overrides: Any) -> dict:
    """A copy of `exp` with the non-None overrides applied and checked again."""
    out = dict(exp)
    out.update({k: v for k, v in overrides.items() if v is not None})
    out["parallel"] = normalise_parallel(out["parallel"])
    _check(out, f"experiment {out['experiment']!r} with overrides")
    return out


def grad_flows(trainable: list[str]) -> list[str]:
    """Modules a gradient flows through: trainable ones and everything after the first."""
    first = min((FORWARD_ORDER.index(m) for m in trainable), default=len(FORWARD_ORDER))
    return list(FORWARD_ORDER[first:])


def _relative(path: Path) -> str:
    """The path as records store it: relative to the working directory (the repository root
    when measuring for tests/measured/), absolute when outside it."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()


# Optional keys a record leaves out at these values (what every older record means).
OPTIONAL_DEFAULTS = {"loss": "cross_entropy", "packing": False, "activation_offloading": False, "alloc_conf": ""}


def changed_keys(stored: dict, entry: dict) -> list[tuple[str, Any, Any]]:
    """Where a record's experiment (`stored`) is not the one a matrix entry now measures
    (`entry`, as `to_record` writes it): (key, the record's value, the entry's), a key the
    record leaves out taken at its default (DEFAULTS, OPTIONAL_DEFAULTS, a LoRA block's
    LORA_DEFAULTS) or, where none is known, not compared (a record older than the key). The
    name and the descriptive keys (a device run's `gpu`) are not the experiment."""

    def value(exp: dict, key: str) -> Any:
        got = exp.get(key, DEFAULTS.get(key, OPTIONAL_DEFAULTS.get(key)))
        return {**LORA_DEFAULTS, **got} if key == "lora" and got else got

    out = []
    for key in (*MEASURED_KEYS[1:], *OPTIONAL_KEYS):
        if key not in stored and key not in DEFAULTS and key not in OPTIONAL_DEFAULTS:
            continue
        if value(stored, key) != value(entry, key):
            out.append((key, stored.get(key), entry.get(key)))
    return out


def to_record(exp: dict) -> dict:
    """The experiment as a record stores it: measured keys in order, repo-relative model."""
    out = {k: exp[k] for k in MEASURED_KEYS}
    out["model"] = _relative(exp["model"])
    out.update({k: exp[k] for k in OPTIONAL_KEYS if exp.get(k) is not None and exp[k] != OPTIONAL_DEFAULTS.get(k)})
    out.update({k: exp[k] for k in DESCRIPTIVE_KEYS if k in exp})
    return out


def expand_matrix(path: str | Path) -> list[tuple[str, dict]]:
    """Every combination of the matrix's axes as (record name, experiment).

    Matrix file: `matrix` (name), `base` (fields shared by all entries), `axes` (an ordered
    mapping from experiment key to either a list of values or a mapping label -> value).
    Checkpointing a module no gradient flows through (nothing in or before it trains, no LoRA
    adapter in it) changes nothing, so such modules are dropped from `gradient_checkpointing`.
    """
    path = Path(path)
    matrix = _read_yaml(path)
    if not isinstance(matrix, dict) or "axes" not in matrix:
        raise ExperimentError(f"{path}: a matrix needs `axes`")
    base = matrix.get("base", {})
    axes = []
    for key, values in matrix["axes"].items():
        labelled = values.items() if isinstance(values, dict) else [(label(key, v), v) for v in values]
        axes.append([(key, label, value) for label, value in labelled])
    out = []
    for combo in itertools.product(*axes):
        raw = _nested({**base}, [(key, value) for key, _, value in combo])
        labels = "_".join(name for _, name, _ in combo)
        raw["experiment"] = f"{matrix.get('matrix', path.stem)}_{labels}"
        # NB: LoRA adapters train inside their modules, so gradients flow there too
        adapted = (raw.get("lora") or {}).get("modules", LORA_DEFAULTS["modules"]) if raw.get("lora") else []
        raw["gradient_checkpointing"] = [
            m for m in raw.get("gradient_checkpointing", []) if m in grad_flows(list(raw.get("trainable", DEFAULTS["trainable"])) + list(adapted))
        ]
        exp = normalise(raw, path.parent, f"{path} entry {labels}")
        out.append((raw["experiment"], exp))
    return out


def _nested(raw: dict, items: list[tuple[str, Any]]) -> dict:
    """`raw` with each (key, value) set; a dotted key (`lora.r`) sets a key of a block."""
    for key, value in items:
        if "." in key:
            block, sub = key.split(".", 1)
            raw[block] = {**(raw.get(block) or {}), sub: value}
        else:
            raw[key] = value
    return raw


def label(key: str, value: Any) -> str:
    """A short name for one experiment value: b16, s2048, projector+language, dp1-zero0, sdpa."""
    if isinstance(value, list):
        return "+".join(value) or "none"
    if key == "parallel":
        if value.get("fsdp") is not None:
            reshard = "" if value["fsdp"].get("reshard_after_forward", True) else "-keep"
            return f"dp{value['dp']}-fsdp{reshard}"
        return f"dp{value['dp']}-zero{value['zero']}"
    if key == "image_size":
        return f"{value[0]}x{value[1]}"
    if key == "alloc_conf":
        # expandable_segments:True,max_split_size_mb:128 -> expandable_segments-True+max_split_size_mb-128
        return value.replace(" ", "").replace(":", "-").replace(",", "+").replace("[", "").replace("]", "") or "alloc-defaults"
    return {
        "micro_batch": f"b{value}",
        "seq_len": f"s{value}",
        "target_len": f"t{value}",
        "lora.r": f"r{value}",
        "lora.dropout": f"drop{value}",
        "video_frames": f"f{value}",
    }.get(key, str(value))
