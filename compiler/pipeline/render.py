"""Stage 8, render: a `Report` as text for people, JSON for programs, TSV for diffs.

Contract: `Report` is everything one estimate produced (`api.run` makes it); the rest are
pure functions from a report (or its rows) to a string; the HTML report is
`html_report.py`, from the same `as_data` numbers. Bytes are printed exactly
in JSON and TSV; the text view prints GiB (2^30 bytes) with two decimals and says so.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, replace
from typing import Any, Mapping

from .evaluate import Node, Row, image_tokens_per_sample
from .resolve import PRECISION_MODES, TRANSFORMERS, DeviceConstants, Gpu, Margin, Setup, Spec, release_text, self_checkpointed
from .replay import REPLAY_ACCOUNT
from .simulate import CATEGORIES, Estimate, Point


@dataclass(frozen=True)
class Report:
    """Everything one estimate produced."""

    spec: Spec
    setup: Setup
    nodes: tuple[Node, ...]
    rows: tuple[Row, ...]
    estimate: Estimate
    allocated: int
    reserved: int
    device: int
    device_constants: DeviceConstants
    gpu: Gpu | None
    parameters: Mapping[str, int]  # module -> parameter count (elements)
    # How the inputs were read: "note: ..." / "warning: ..." lines of --from-command and
    # --deepspeed, as the CLI prints them on stderr.
    notes: tuple[str, ...] = ()

    @property
    def tensors(self) -> int:
        """The tensors' bytes at the steady step's peak (each rounded to 512 B; the breakdown's
        sum): `allocated` less the remainders of blocks the allocator does not split."""
        return self.estimate.peak.total

    def with_notes(self, notes: tuple[str, ...]) -> "Report":
        return replace(self, notes=tuple(notes))

    @property
    def margin(self) -> Margin:
        """What the verdict keeps free: --margin, else the catalog's device.margin_pct."""
        return self.setup.margin or self.device_constants.margin

    @property
    def budget(self) -> int | None:
        """The most the device figure may be on `gpu` and fit: its memory less the margin."""
        return None if self.gpu is None else self.margin.budget(self.gpu.memory)

    @property
    def fits(self) -> bool | None:
        """The verdict with --gpu: the replay never runs out of the GPU's memory and the device
        figure is within the budget; None without a GPU."""
        return None if self.gpu is None else self.device <= self.budget and self.estimate.oom is None


GIB = 1 << 30
TABLE_COLUMNS = (
    "path", "type", "count", "trainable", "grad_flows", "checkpointed", "dims",
    "parameters", "gradients", "optimizer_states", "buffers", "activations", "held", "transient_forward", "transient_backward",
)  # fmt: skip


def gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def margin_line(margin, memory: int) -> str:
    """'margin 0.5 % = 0.40 GiB kept free (specs/gpus.yaml device.margin_pct: the worst ...)'."""
    size = "" if margin.percent is None else f" = {gib(margin.reserve(memory))} GiB"
    why = f"{margin.source}: {margin.summary}" if margin.summary else margin.source
    return f"margin {margin.text}{size} kept free ({why})"


def margin_data(margin, memory: int) -> dict[str, Any]:
    """The margin as JSON: `bytes` exact; `percent` null for a size given in bytes."""
    return {
        "percent": None if margin.percent is None else float(margin.percent),
        "bytes": margin.reserve(memory),
        "source": margin.source,
        "summary": margin.summary,
    }


def _videos(s) -> str:
    if not s.videos_per_sample:
        return ""
    return f" + {s.videos_per_sample} video(s) of {s.video_frames} frames"


# The PRECISIONS keys by Lightning's names, and the realization of a mixed one in a few words.
LIGHTNING_NAMES = {"fp32": "32-true", "bf16": "bf16-true", "fp16": "16-true", "bf16-mixed": "bf16-mixed", "fp16-mixed": "16-mixed"}
MODE_LABELS = {
    "master-weights": "16-bit weights, fp32 master weights",
    "autocast": "autocast on fp32 weights",
    "fsdp-policy": "FSDP2 policy on fp32 shards",
}


def precision_label(s) -> str:
    """The precision by Lightning's name, with how a mixed one is realized."""
    name = LIGHTNING_NAMES.get(s.precision, s.precision)
    return f"{name} ({MODE_LABELS[s.mode]})" if s.mode in MODE_LABELS else name


def setup_line(r: Report) -> str:
    s = r.setup
    merged = image_tokens_per_sample(r.nodes)  # at the experiment's size (tiles, native resolution)
    image_tokens = s.vision_items * r.spec.image_tokens if merged is None else merged
    kind = "image and video" if s.videos_per_sample and s.images_per_sample else "video" if s.videos_per_sample else "image"
    seq = f"seq {s.seq_len}" + (f" ({image_tokens} {kind} + {s.seq_len - image_tokens} text)" if image_tokens else "")
    if s.target_len:
        seq = f"source {s.seq_len}, target {s.target_len}"  # an encoder-decoder model's two sequences
    opt = s.optimizer.label
    ckpt = ",".join(sorted(s.gradient_checkpointing)) or "off"
    forced = self_checkpointed(r.spec)
    if forced:
        ckpt += f" ({','.join(sorted(forced))} by the model's own code, whatever the setting)"
    return (
        f"micro-batch {s.micro_batch} x {s.images_per_sample} image(s){_videos(s)} | {seq} | {precision_label(s)} | {opt} | "
        f"attention {s.attention} | checkpointing {ckpt} | "
        + (device_map_label(s.device_map) if s.device_map is not None else f"dp {s.dp} {_sharding(s)}")
        + (f" | {_lora_label(s.lora)}" if s.lora is not None else "")
        + (f" | peft modules_to_save {','.join(s.lora.modules_to_save)}" if s.lora is not None and s.lora.modules_to_save else "")
        + (f" | peft bias {s.lora.bias}" if s.lora is not None and s.lora.bias != "none" else "")
        + (f" | {quantization_label(s.quantization)}" if s.quantization is not None else "")
        + _tricks(s)
        + (f" | transformers {release_text(s.transformers)}" if s.transformers != TRANSFORMERS else "")
    )


def _parameters(r: Report, counted: int) -> str:
    """The model's parameter count. Under bitsandbytes the count is the checkpoint's (the
    formulas' bytes over bytes.param would count packed 4-bit codes as half a parameter)."""
    if r.setup.quantization is None:
        return f"{counted:,} parameters"
    declared = sum(m.parameters for m in r.spec.modules)
    return f"{declared:,} parameters, {quantization_label(r.setup.quantization)}"


def _trained(s) -> str:
    """What trains: whole modules, and the adapters LoRA adds."""
    parts = sorted(s.trainable)
    if s.lora is not None:
        parts.append(f"{'DoRA' if s.lora.use_dora else 'LoRA'} adapters in {', '.join(sorted(s.lora.modules))}")
    return ", ".join(parts) or "none"


def _lora_label(lora) -> str:
    """`LoRA r16 alpha 32 dropout 0.05 (q_proj,k_proj,v_proj,o_proj)`."""
    targets = lora.target_modules if isinstance(lora.target_modules, str) else ",".join(lora.target_modules)
    return f"{'DoRA' if lora.use_dora else 'LoRA'} r{lora.r} alpha {lora.alpha:g} dropout {lora.dropout:g} ({targets})"


def _sharding(s) -> str:
    if s.fsdp is None:
        ds = s.deepspeed
        optimizer = f", optimizer offloaded to {ds.offload_optimizer}" if ds is not None and ds.offload_optimizer != "none" else ""
        param = f", parameters offloaded to {ds.offload_param}" if ds is not None and ds.offload_param != "none" else ""
        return f"ZeRO-{s.zero}{optimizer}{param}"
    keep = "reshard after forward" if s.fsdp.reshard_after_forward else "no reshard after forward"
    return f"FSDP2 ({keep}, reduce {s.fsdp.reduce_dtype})"


def device_map_label(dm) -> str:
    how = dm.strategy or "explicit map"
    memory = f", max_memory {' '.join(f'{b / 2**30:.2f}' for _, b in dm.max_memory)} GiB" if dm.max_memory else ""
    return f"device_map {how} over {dm.gpus} GPUs{memory}"


def device_map_lines(r: Report) -> list[str]:
    """Each GPU's figures under a device_map (the peak above is the largest GPU's)."""
    e = r.estimate
    if not e.devices:
        return []
    lines = [
        "",
        f"per GPU ({device_map_label(r.setup.device_map)}; the peak above is the largest, which 'fits' decides on)",
        f"  {'gpu':<4} {'allocated':>10} {'reserved':>10} {'weights':>10}   peak at",
    ]
    for d in e.devices:
        weights = sum(c["parameters"] for c in d.resident.values())
        lines.append(f"  {d.gpu:<4} {gib(d.allocated):>10} {gib(d.reserved):>10} {gib(weights):>10}   {_where(d.peak)}")
    return lines


def quantization_label(q) -> str:
    """`bitsandbytes 4-bit nf4, double quant (language)`."""
    kind = f"4-bit {q.quant_type}" + (", double quant" if q.double_quant else "") if q.bits == 4 else "8-bit LLM.int8()"
    return f"bitsandbytes {kind} ({', '.join(sorted(q.modules))})"


def _tricks(s) -> str:
    """The memory tricks that are on, for the setup line (nothing when none is)."""
    on = []
    if s.loss != "cross_entropy":
        on.append(f"loss {s.loss}")
    if s.packing:
        on.append(f"packed into 1 x {s.tokens} tokens")
    if s.activation_offloading:
        on.append("activations offloaded to host")
    if s.tp > 1 or s.pp > 1:
        on.append(f"tp {s.tp}{' + sp' if s.sp else ''} pp {s.pp} (tensor rank 0 of pipeline stage 1)")
    return "".join(" | " + t for t in on)


def _where(p: Point) -> str:
    return f"{p.phase} at {p.path}"


def _unsplit(allocated: int, p: Point) -> str:
    """What max_memory_allocated counts beyond the tensors at the peak: the remainders of
    blocks the caching allocator did not split (a large-pool block keeps up to 1 MiB extra)."""
    extra = allocated - p.total
    return f" (the tensors' peak {p.total:,} B; + {extra:,} B: block remainders not split)" if extra else ""


def breakdown_table(point: Point) -> list[str]:
    head = f"  {'module':<12}" + "".join(f"{c.replace('_', ' '):>18}" for c in CATEGORIES) + f"{'total':>12}"
    lines = [head]
    totals = dict.fromkeys(CATEGORIES, 0)
    for module, cats in point.breakdown.items():
        if module.startswith("fsdp-") and not any(cats.values()):
            continue  # NB: FSDP2's buffer rows appear once a buffer has
        lines.append(f"  {module:<12}" + "".join(f"{gib(cats[c]):>18}" for c in CATEGORIES) + f"{gib(sum(cats.values())):>12}")
        for c in CATEGORIES:
            totals[c] += cats[c]
    lines.append(f"  {'total':<12}" + "".join(f"{gib(totals[c]):>18}" for c in CATEGORIES) + f"{gib(sum(totals.values())):>12}")
    return lines


def origin_lines(spec) -> list[str]:
    """`from ...`: where a launch script named the model, when no model file was given."""
    return [f"from      {spec.origin['description']}"] if spec.origin else []


def text(r: Report) -> str:
    e = r.estimate
    s = r.setup
    total_params = sum(r.parameters.values())
    trainable = e.trainable_params
    lines = [
        f"memspec estimate: {s.experiment}  ({s.file})",
        f"model     {r.spec.model}: {_parameters(r, total_params)}, {trainable:,} trainable ({_trained(s)})"
        + (f", on this GPU (tensor rank 0 of {s.tp}, pipeline stage 1 of {s.pp})" if s.tp > 1 or s.pp > 1 else ""),
        *origin_lines(r.spec),
        f"setup     {setup_line(r)}",
        "",
        "peak GPU memory per GPU, steady-state step (GiB = 2^30 bytes)",
        f"  allocated  {gib(r.allocated):>8} GiB  {r.allocated:>16,} B   torch.cuda.max_memory_allocated(); {_where(e.peak)}{_unsplit(r.allocated, e.peak)}",
        f"  reserved   {gib(r.reserved):>8} GiB  {r.reserved:>16,} B   torch.cuda.max_memory_reserved(); {REPLAY_ACCOUNT}",
        f"  device     {gib(r.device):>8} GiB  {r.device:>16,} B   nvidia-smi; reserved + CUDA context {gib(r.device_constants.cuda_context)} GiB"
        + (f" + NCCL {gib(r.device_constants.nccl_per_communicator)} GiB" if s.dp > 1 else ""),
        f"  first step {gib(e.allocated_first_step):>8} GiB  {e.allocated_first_step:>16,} B   allocated; optimizer states appear at its step(); {_where(e.first_step)}",
        f"  seed sum   {gib(e.seed_sum):>8} GiB  {e.seed_sum:>16,} B   parameters + gradients + optimizer states + activations (seed paper Eq. 1)",
        "",
        f"breakdown at the peak (GiB), {_where(e.peak)}; parameters include buffers and the batch's input tensors,",
        f"'cublas' is the cuBLAS/cuBLASLt workspaces of {s.target.gemm_threads} GEMM threads on {s.target.key} ({s.target.arch})"
        + ("" if r.gpu else ", the default GPU: pass --gpu for yours"),
        *breakdown_table(e.peak),
        "",
        f"allocator PYTORCH_CUDA_ALLOC_CONF: {s.alloc_conf.describe()}",
        *device_map_lines(r),
    ]
    if r.gpu is not None:
        headroom = r.gpu.memory - r.device
        verdict = "fits" if r.fits else "does NOT fit"
        lines += [
            "",
            f"gpu       {r.gpu.key} ({r.gpu.name}, {gib(r.gpu.memory)} GiB): {verdict}, headroom {gib(headroom)} GiB against the device figure",
            f"          {margin_line(r.margin, r.gpu.memory)}",
        ]
        if e.oom is not None:
            lines.append(f"          {e.oom.message()}")
    if e.not_modelled:
        lines += ["", "not modelled (the figures above leave these out):"] + [f"  - {x}" for x in e.not_modelled]
    return "\n".join(lines) + "\n"


def as_data(r: Report) -> dict[str, Any]:
    e = r.estimate
    s = r.setup
    return {
        "schema": "memspec/estimate/v1",
        "experiment": s.experiment,
        "file": s.file,
        "model": r.spec.model,
        **({"model_from": dict(r.spec.origin)} if r.spec.origin else {}),
        "setup": _setup_data(s),
        "parameters": dict(r.parameters),
        "trainable_parameters": e.trainable_params,
        "peak": {
            "allocated": r.allocated,
            "allocated_first_step": e.allocated_first_step,
            "reserved": r.reserved,
            "device": r.device,
            "steady_state": _point_data(e.peak),
            "first_step": _point_data(e.first_step),
        },
        "seed_sum": e.seed_sum,
        "resident": e.resident,
        "activations_end_of_forward": e.activations_end_of_forward,
        "device_constants": {"cuda_context": r.device_constants.cuda_context, "nccl_per_communicator": r.device_constants.nccl_per_communicator},
        "target_gpu": {"key": s.target.key, "arch": s.target.arch, "workspace_per_thread": s.target.workspace},
        "gpu": _gpu_data(r),
        "allocator": {"PYTORCH_CUDA_ALLOC_CONF": s.alloc_conf.text},
        **({"device_map": _device_map_data(r)} if e.devices else {}),
        "not_modelled": list(e.not_modelled),
    }


def _point_data(p: Point) -> dict[str, Any]:
    return {"phase": p.phase, "layer": p.path, "allocated": p.total, "breakdown": p.breakdown}


def _setup_data(s) -> dict[str, Any]:
    """The `setup` object of the JSON: every knob of the estimate, the defaults' too."""
    return {
        "micro_batch": s.micro_batch,
        "seq_len": s.seq_len,
        "images_per_sample": s.images_per_sample,
        **({"videos_per_sample": s.videos_per_sample, "video_frames": s.video_frames} if s.videos_per_sample else {}),
        "trainable": sorted(s.trainable),
        "precision": LIGHTNING_NAMES.get(s.precision, s.precision),
        "precision_mode": s.mode,
        "precision_realization": PRECISION_MODES[s.mode],
        **({"versions": {"transformers": release_text(s.transformers)}} if s.transformers != TRANSFORMERS else {}),
        "optimizer": _optimizer_json(s.optimizer),
        **(
            {
                "lora": {
                    "r": s.lora.r,
                    "alpha": s.lora.alpha,
                    "dropout": s.lora.dropout,
                    "target_modules": s.lora.target_modules if isinstance(s.lora.target_modules, str) else list(s.lora.target_modules),
                    "modules": sorted(s.lora.modules),
                    "use_dora": s.lora.use_dora,
                    "modules_to_save": list(s.lora.modules_to_save),
                    "bias": s.lora.bias,
                }
            }
            if s.lora is not None
            else {}
        ),
        **(
            {
                "quantization": {
                    "bits": s.quantization.bits,
                    "quant_type": s.quantization.quant_type,
                    "double_quant": s.quantization.double_quant,
                    "modules": sorted(s.quantization.modules),
                    "skip_modules": list(s.quantization.skip_modules),
                }
            }
            if s.quantization is not None
            else {}
        ),
        **({"use_dora": True} if s.lora is not None and s.lora.use_dora else {}),
        **({"lora_modules_to_save": list(s.lora.modules_to_save)} if s.lora is not None and s.lora.modules_to_save else {}),
        **({"lora_bias": s.lora.bias} if s.lora is not None and s.lora.bias != "none" else {}),
        "gradient_checkpointing": sorted(s.gradient_checkpointing),
        "attention": s.attention,
        "parallel": _parallel_data(s),
        "loss": s.loss,
        "packing": s.packing,
        "activation_offloading": s.activation_offloading,
        "bytes": dict(s.bytes),
    }


def _parallel_data(s) -> dict[str, Any]:
    return {
        "dp": s.dp,
        "zero": s.zero,
        **({"offload_optimizer": s.deepspeed.offload_optimizer} if s.deepspeed and s.deepspeed.offload_optimizer != "none" else {}),
        **({"offload_param": s.deepspeed.offload_param} if s.deepspeed and s.deepspeed.offload_param != "none" else {}),
        **({"fsdp": {"reshard_after_forward": s.fsdp.reshard_after_forward, "reduce_dtype": s.fsdp.reduce_dtype}} if s.fsdp else {}),
        **({"tp": s.tp, "sp": s.sp, "pp": s.pp} if s.tp > 1 or s.pp > 1 else {}),
    }


def _gpu_data(r: Report) -> dict[str, Any] | None:
    """The GPU asked about: the verdict, the headroom and margin, the simulated out-of-memory."""
    e = r.estimate
    return (
        None
        if r.gpu is None
        else {
            "key": r.gpu.key,
            "memory": r.gpu.memory,
            "fits": r.fits,
            "headroom": r.gpu.memory - r.device,
            "margin": margin_data(r.margin, r.gpu.memory),
            "budget": r.budget,
            "out_of_memory": None
            if e.oom is None
            else {"allocation": e.oom.event, "requested": e.oom.requested, "allocated": e.oom.allocated, "reserved": e.oom.reserved},
        }
    )


def _device_map_data(r: Report) -> dict[str, Any]:
    """A device_map estimate: the placement and each GPU's figures."""
    s, e = r.setup, r.estimate
    return {
        "strategy": s.device_map.strategy or "explicit",
        "gpus": s.device_map.gpus,
        "max_memory": [b for _, b in s.device_map.max_memory],
        "placement": _placement(r),
        "per_gpu": [
            {
                "gpu": d.gpu,
                "allocated": d.allocated,
                "reserved": d.reserved,
                "first_step": d.allocated_first_step,
                "steady_state": _point_data(d.peak),
                "resident": d.resident,
            }
            for d in e.devices
        ],
    }


def _placement(r: Report) -> dict[str, int]:
    """The GPU of each top-level layer (a module's children) under a device_map."""
    from .walks import device_map

    placement = device_map.place(r.nodes, r.setup)
    return {c.inst.path: placement[id(c)] for n in r.nodes for c in n.children}


def json_text(r: Report) -> str:
    return json.dumps(as_data(r), indent=2) + "\n"


def table_data(rows: tuple[Row, ...]) -> list[dict[str, Any]]:
    """The layer table as `memspec table --format json` prints it: one object per row."""
    return [dataclasses.asdict(r) for r in rows]


def _cell(row: Row, column: str) -> str:
    value = getattr(row, column)
    if column == "activations" and value is None:
        return "-"
    if column == "trainable" and not value and row.gradients:
        return "bias"  # NB: peft's bias option: only the parameters named bias train
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def table_tsv(rows: tuple[Row, ...]) -> str:
    lines = ["\t".join(TABLE_COLUMNS)]
    lines += ["\t".join(_cell(r, c) for c in TABLE_COLUMNS) for r in rows]
    return "\n".join(lines) + "\n"


def table_text(rows: tuple[Row, ...]) -> str:
    """Fixed-width view: indented paths, bytes per instance in MiB, counts."""
    mib = 1 << 20
    head = f"{'path':<50} {'type':<20} {'n':>3} {'tr':>2} {'gf':>2} {'params':>10} {'grads':>10} {'optim':>10} {'acts':>10} {'fwd tmp':>10} {'bwd tmp':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:

        def m(v):
            return "-" if v is None else f"{v / mib:.1f}"

        lines.append(
            f"{r.path:<50} {r.type:<20} {r.count:>3} {'y' if r.trainable else 'b' if r.gradients else 'n':>2} {'y' if r.grad_flows else 'n':>2} "
            f"{m(r.parameters):>10} {m(r.gradients):>10} {m(r.optimizer_states):>10} {m(r.activations):>10} {m(r.transient_forward):>10} {m(r.transient_backward):>10}"
        )
    lines.append(
        "bytes per instance in MiB (2^20); acts '-': every tensor it saves is charged to an earlier row"
        + ("; tr 'b': only its biases train (peft bias)" if any(r.gradients and not r.trainable for r in rows) else "")
    )
    return "\n".join(lines) + "\n"


def _answer_line(label: str, a, bound: str = "the search bound") -> str:
    if a.value is None:
        return f"  {label}: none fits" + (f" ({a.knob} {a.next_value} needs {gib(a.next_device)} GiB)" if a.next_device else "")
    line = f"  {label}: {a.value:,}  (device {gib(a.device)} GiB)"
    if a.next_value is not None:
        line += f"; {a.next_value:,} needs {gib(a.next_device)} GiB"
    else:
        line += f"; {bound} ({a.value:,}) still fits"
    return line


def fit_text(f) -> str:
    s = f.base.setup
    lines = [
        f"memspec fit: {s.experiment} on {f.gpu.key} ({f.gpu.name}, {gib(f.gpu.memory)} GiB)",
        *origin_lines(f.base.spec),
        f"setup     {setup_line(f.base)}",
        f"budget    {gib(f.budget)} GiB for the device figure (nvidia-smi), {margin_line(f.margin, f.gpu.memory)}",
        f"allocator PYTORCH_CUDA_ALLOC_CONF: {s.alloc_conf.describe()} (reserved: {REPLAY_ACCOUNT})",
        "",
        _answer_line(
            f"largest micro-batch at seq {s.seq_len}",
            f.micro_batch,
            "the most samples whose image slices the tower runs at once (vision_batch_size; more is not modelled, E725)"
            if f.micro_batch_bound and f.micro_batch.value == f.micro_batch_bound
            else "the search bound",
        ),
        *_expandable_lines(f),
        _answer_line(
            f"longest sequence at micro-batch {s.micro_batch}",
            f.seq_len,
            "the model's context length (the spec's context_length)" if f.context_length and f.seq_len.value == f.context_length else "the search bound",
        ),
    ]
    if f.dp is not None:
        lines.append(_answer_line(f"smallest dp at micro-batch {s.micro_batch}, seq {s.seq_len}, {_sharding(s)}", f.dp))
    x = f.expandable
    evaluations = f.micro_batch.evaluations + f.seq_len.evaluations + (f.dp.evaluations if f.dp else 0) + (x.evaluations if x else 0)
    lines += [
        "",
        f"{evaluations} estimate{'s' if evaluations != 1 else ''}; the setup as given needs {gib(f.base.device)} GiB ({'fits' if f.fits else 'does not fit'})",
    ]
    lines += _lever_lines(f)
    if f.base.estimate.not_modelled:
        lines += ["not modelled (the figures above leave these out):"] + [f"  - {x}" for x in f.base.estimate.not_modelled]
    return "\n".join(lines) + "\n"


def _expandable_lines(f) -> list[str]:
    """The largest micro-batch under expandable_segments:True, beside the answer it would
    replace, where it is another."""
    x = f.expandable
    if x is None or x.value is None or x.value == f.micro_batch.value:
        return []
    return ["  " + _answer_line(f"with --alloc-conf expandable_segments:True ({f.expandable_margin.text} margin)", x)]


def _lever_lines(f) -> list[str]:
    """What to change, one lever at a time, cheapest first (empty when the setup fits)."""
    if f.levers_at is None:
        return []
    s = f.base.setup
    smaller = (
        "nor does micro-batch 1; each change alone at micro-batch 1"
        if f.micro_batch.value is None
        else f"micro-batch {f.micro_batch.value} does; each change alone at micro-batch {f.levers_at}"
    )
    lines = ["", f"levers: the setup as given does not fit, {smaller}, seq {s.seq_len}, cheapest first:"]
    width = max((len(x.lever) for x in f.levers), default=0)
    lines += [f"  {x.lever:<{width}}  {gib(x.device):>7} GiB  {'fits' if x.fits else 'does not fit':<12}  {x.change}" for x in f.levers]
    return lines if f.levers else lines + ["  none applies to this setup"]


def fit_json(f) -> str:
    def answer(a):
        return None if a is None else {k: getattr(a, k) for k in ("value", "device", "next_value", "next_device", "evaluations")}

    data = {
        "schema": "memspec/fit/v2",
        "gpu": {"key": f.gpu.key, "memory": f.gpu.memory},
        "margin": margin_data(f.margin, f.gpu.memory),
        "budget": f.budget,
        "allocator": {"PYTORCH_CUDA_ALLOC_CONF": f.base.setup.alloc_conf.text},
        **({"model_from": dict(f.base.spec.origin)} if f.base.spec.origin else {}),
        "setup": as_data(f.base)["setup"],
        "device_as_given": f.base.device,
        "fits_as_given": f.fits,
        "micro_batch": answer(f.micro_batch),
        "seq_len": answer(f.seq_len),
        "dp": answer(f.dp),
        "context_length": f.context_length,
        "micro_batch_bound": f.micro_batch_bound,
        "levers_at": None if f.levers_at is None else {"micro_batch": f.levers_at, "seq_len": f.base.setup.seq_len},
        "levers": [{"lever": x.lever, "change": x.change, "device_bytes": x.device, "fits": x.fits} for x in f.levers],
        # the largest micro-batch under expandable_segments:True, with its own margin
        "expandable_segments": None
        if f.expandable is None
        else {
            "micro_batch": answer(f.expandable),
            "margin": margin_data(f.expandable_margin, f.gpu.memory),
            "budget": f.expandable_margin.budget(f.gpu.memory),
        },
    }
    return json.dumps(data, indent=2) + "\n"


SWEEP_FIGURES = ("allocated", "reserved", "device", "first_step", "peak_phase", "peak_layer")


def _sweep_values(row) -> dict[str, Any]:
    r = row.report
    out: dict[str, Any] = dict(row.point)
    out.update(
        allocated=r.allocated,
        reserved=r.reserved,
        device=r.device,
        first_step=r.estimate.allocated_first_step,
        peak_phase=r.estimate.peak.phase,
        peak_layer=r.estimate.peak.path,
    )
    if r.gpu is not None:
        # NB: each point's own budget: the catalog's margin depends on the kind of step
        # (checkpointing, eager attention), which a sweep may vary
        out.update(fits=row.fits, headroom=row.headroom, budget=r.budget)
    return out


def _sweep_margins(s) -> str:
    """The margin line, or each distinct margin of the points with the points' kinds."""
    margins = list(dict.fromkeys(row.report.margin for row in s.rows))
    if len(margins) == 1:
        return margin_line(margins[0], s.gpu.memory)
    return "margins by kind of step: " + "; ".join(margin_line(m, s.gpu.memory).removeprefix("margin ") for m in margins)


def sweep_columns(s) -> list[str]:
    return list(s.rows[0].point) + list(SWEEP_FIGURES) + (["fits", "headroom"] if s.gpu is not None else [])


def sweep_csv(s) -> str:
    """One row per point, bytes exact; `fits` is true/false."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    columns = sweep_columns(s)
    w.writerow(columns)
    for row in s.rows:
        values = _sweep_values(row)
        w.writerow(["true" if values[c] is True else "false" if values[c] is False else values[c] for c in columns])
    return buf.getvalue()


def sweep_json(s) -> str:
    data = {
        "schema": "memspec/sweep/v1",
        "experiment": s.base.experiment,
        "file": s.base.file,
        "model": s.spec.model,
        **({"model_from": dict(s.spec.origin)} if s.spec.origin else {}),
        "knobs": {k: list(v) for k, v in s.grid.items()},
        "gpu": None
        if s.gpu is None
        else {"key": s.gpu.key, "memory": s.gpu.memory, "margin": margin_data(s.rows[0].report.margin, s.gpu.memory), "budget": s.rows[0].report.budget},
        "rows": [_sweep_values(row) for row in s.rows],
    }
    return json.dumps(data, indent=2) + "\n"


def sweep_text(s) -> str:
    knobs = list(s.rows[0].point)
    head = [k.replace("_", " ") for k in knobs] + ["allocated", "reserved", "device", "first step", "peak at"]
    if s.gpu is not None:
        head += ["fits", "headroom"]
    body = []
    for row in s.rows:
        v = _sweep_values(row)
        cells = [str(v[k]) for k in knobs] + [gib(v[k]) for k in ("allocated", "reserved", "device", "first_step")]
        cells.append(f"{v['peak_phase']} at {v['peak_layer']}")
        if s.gpu is not None:
            cells += ["yes" if v["fits"] else "NO", gib(v["headroom"])]
        body.append(cells)
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    left = {len(knobs) + 4}  # the peak location reads left-aligned

    def line(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    title = f"memspec sweep: {s.base.experiment}  ({s.base.file}), {len(s.rows)} points"
    if s.gpu is not None:
        title += f", on {s.gpu.key} ({gib(s.gpu.memory)} GiB), {_sweep_margins(s)}"
    lines = [
        title,
        *origin_lines(s.spec),
        "",
        line(head),
        *(line(c) for c in body),
        "",
        "GiB = 2^30 bytes; device = reserved + CUDA context (+ NCCL when dp > 1), what nvidia-smi shows and what fits compares"
        + (" with the GPU's memory less the margin" if s.gpu is not None else ""),
        f"reserved: {REPLAY_ACCOUNT}; PYTORCH_CUDA_ALLOC_CONF: {s.base.alloc_conf.describe()}",
    ]
    if s.rows[0].report.estimate.not_modelled:
        lines += ["not modelled (the figures above leave these out):"] + [f"  - {x}" for x in s.rows[0].report.estimate.not_modelled]
    return "\n".join(lines) + "\n"


def _optimizer_json(o) -> dict:
    """type, impl, momentum, and the options that are not their defaults."""
    out = {"type": o.type, "impl": o.impl, "momentum": o.momentum}
    out.update(
        {
            k: v
            for k, v, default in (
                ("weight_decay", o.weight_decay, 0.0),
                ("bits", o.bits, 32),
                ("paged", o.paged, False),
                ("param_groups", o.param_groups, "one"),
            )
            if v != default
        }
    )
    return out
