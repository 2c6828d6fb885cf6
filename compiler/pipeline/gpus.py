"""The GPUs an estimate is for: the catalog of specs/gpus.yaml, memory sizes and margins.

Contract: `gpu_catalog()` is the catalog's `Gpu`s (memory, architecture, cuBLAS workspaces)
and the device-side `DeviceConstants` (CUDA context, NCCL, the margins a "fits" verdict
keeps), read once; `find_gpu` is the GPU `--gpu` or an experiment's `gpu:` names (a catalog
key, or a memory size for a GPU the catalog lacks); `parse_size` and `parse_margin` read the
command line's sizes (24GiB, 80GB, 5%); `catalog_constants` lists the catalog's constants
an estimate used, each a `Constant` with its source. Part of stage 3 (resolve), which
re-exports all of it; nothing here reads an experiment.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any, Mapping

from ..errors import MemspecError, did_you_mean
from .load import Document

KIB = 1 << 10
MIB = 1 << 20


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    memory: int  # bytes
    arch: str  # sm80, sm90, ...
    workspace: int  # cuBLAS + cuBLASLt workspace bytes per GEMM thread
    gemm_threads: int  # threads holding one workspace each in a steady-state step
    # each thread's workspaces as the allocator gets them: cuBLAS's, then cuBLASLt's (they sum to workspace)
    workspace_blocks: tuple[int, ...] = ()

    @property
    def workspace_allocations(self) -> tuple[int, ...]:
        """One GEMM thread's workspaces as the allocator gets them: cuBLAS's, then cuBLASLt's
        (one block of `workspace` where the catalog does not split it)."""
        return self.workspace_blocks or (self.workspace,)


# Units of a memory size on the command line (--gpu 24GiB, --margin 2GiB): SI powers of 10
# as GPU vendors print them (80GB = 80 x 10^9 bytes), binary powers of 2 as torch and
# nvidia-smi count (MiB = 2^20 bytes). Matched without regard to case.
SIZE_UNITS: Mapping[str, tuple[str, int]] = {
    u.lower(): (u, n)
    for u, n in (("B", 1), ("KB", 10**3), ("MB", 10**6), ("GB", 10**9), ("TB", 10**12), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40))
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)")
SIZE_HELP = "write a number and a unit: 24GiB (GiB = 2^30 bytes) or 80GB (GB = 10^9 bytes)"


def parse_size(text: str) -> int:
    """'24GiB' -> 25_769_803_776, '80GB' -> 80_000_000_000, '1.5GiB' -> 1_610_612_736:
    exact integer bytes. ValueError (what is wrong, in a few words) for anything else."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise ValueError("not a number followed by a unit")
    number, unit = m.groups()
    if unit.lower() not in SIZE_UNITS:
        raise ValueError("no unit" if not unit else f"unknown unit '{unit}'")
    size = Fraction(number) * SIZE_UNITS[unit.lower()][1]
    if size.denominator != 1:
        raise ValueError(f"not a whole number of bytes ({float(size):,.1f})")
    return int(size)


@dataclass(frozen=True)
class Margin:
    """Memory a "fits" verdict keeps free beyond the device figure: a percentage of the GPU's
    memory (`percent`, exact) or a number of bytes (`size`), with where it was set."""

    percent: Fraction | None
    size: int | None
    source: str  # "specs/gpus.yaml device.margin_pct" or "--margin"
    summary: str = ""  # why this much, for the output

    def reserve(self, memory: int) -> int:
        """Bytes kept free on a GPU of `memory` bytes; a percentage is rounded up to a byte."""
        return self.size if self.size is not None else math.ceil(memory * self.percent / 100)

    def budget(self, memory: int) -> int:
        """The most a device figure may be on that GPU and fit."""
        return memory - self.reserve(memory)

    @property
    def text(self) -> str:
        """'0.5 %' or '2.00 GiB', as written in the output."""
        return f"{float(self.percent):g} %" if self.percent is not None else f"{self.size / 2**30:.2f} GiB"


def parse_margin(text: str) -> Margin:
    """--margin: '5%' or '5' (percent of the GPU's memory), '2GiB' or '500MB' (bytes)."""
    body = text.strip().removesuffix("%").strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", body):
        return Margin(Fraction(body), None, "--margin")
    return Margin(None, parse_size(text), "--margin")


@dataclass(frozen=True)
class DeviceConstants:
    cuda_context: int
    nccl_per_communicator: int
    default_gpu: Gpu  # whose architecture an estimate without --gpu assumes
    margin: Margin = Margin(Fraction(0), None, "")  # what a verdict keeps free unless --margin says
    # the margins of other kinds of step: "checkpointed", "checkpointed_eager", "packed",
    # "expandable_segments" (see margin_for)
    margins: Mapping[str, Margin] = field(default_factory=dict)

    def margin_for(self, checkpointing: bool, attention: str, expandable_segments: bool = False, packed: bool = False) -> Margin:
        """The catalog's margin for a step of this kind: checkpointed steps fragment the cache
        unlike the estimate's replay, those with eager attention more; a packed batch (one row
        of b x s tokens whose sequences each layer masks apart) more still, whatever its
        checkpointing; under expandable_segments:True a block has no other segment's hole to
        land in, and one margin covers every kind (specs/gpus.yaml device.margin_pct;
        `expandable_segments`: that setting alone, as measured, AllocatorConfig.only_expandable)."""
        if expandable_segments:
            return self.margins.get("expandable_segments", self.margin)
        if packed:
            return self.margins.get("packed", self.margin)
        if not checkpointing:
            return self.margin
        return self.margins.get("checkpointed_eager" if attention == "eager" else "checkpointed", self.margin)


@dataclass(frozen=True)
class Constant:
    """A named constant an estimate used: where it is set, its value, and what pins it."""

    name: str
    value: int | str
    unit: str
    source: str


@lru_cache(maxsize=1)
def _catalog() -> Document:
    """specs/gpus.yaml, validated."""
    from ..paths import specs_dir
    from .validate import checked_document

    return checked_document(specs_dir() / "gpus.yaml", "gpus")


def _per_arch(entry: Mapping[str, Any], arch: str) -> int:
    values = entry["value"]
    return values.get(arch, values["default"])


@lru_cache(maxsize=1)
def gpu_catalog() -> tuple[Mapping[str, Gpu], DeviceConstants]:
    """specs/gpus.yaml: the GPU catalog and the device-side constants."""
    doc = _catalog()
    alloc = doc.data["allocator"]

    def per_arch(key: str, arch: str) -> int:
        return _per_arch(alloc[key], arch)

    gpus = {
        k: Gpu(
            k,
            v["name"],
            v["memory_mib"] * MIB,
            v["arch"],
            (per_arch("cublas_workspace_kib", v["arch"]) + per_arch("cublaslt_workspace_kib", v["arch"])) * KIB,
            per_arch("gemm_threads", v["arch"]),
            (per_arch("cublas_workspace_kib", v["arch"]) * KIB, per_arch("cublaslt_workspace_kib", v["arch"]) * KIB),
        )
        for k, v in doc.data["gpus"].items()
    }
    d = doc.data["device"]
    m = d["margin_pct"]
    margin = Margin(Fraction(str(m["value"])), None, "specs/gpus.yaml device.margin_pct", " ".join(m["summary"].split()))
    margins = {
        kind: Margin(Fraction(str(m[kind]["value"])), None, f"specs/gpus.yaml device.margin_pct.{kind}", " ".join(m[kind]["summary"].split()))
        for kind in ("checkpointed", "checkpointed_eager", "packed", "expandable_segments")
    }
    default = doc.data["default_gpu"]
    if default not in gpus:
        raise MemspecError(
            doc.diag("E208", "$.default_gpu", f"default_gpu {default!r} is not in the catalog", f"one of {', '.join(gpus) or 'the gpus: entries (none given)'}")
        )
    consts = DeviceConstants(d["cuda_context_mib"]["value"] * MIB, d["nccl_per_communicator_mib"]["value"] * MIB, gpus[default], margin, margins)
    return gpus, consts


def find_gpu(text: str, gpus: Mapping[str, Gpu], consts: DeviceConstants) -> Gpu | tuple[str, str, str]:
    """The GPU `--gpu` (or an experiment's `gpu:`) names: a catalog key, or a memory size
    (24GiB, 80GB) for a GPU the catalog lacks, which gets the default GPU's architecture
    constants. Else (code, message, help) of what is wrong."""
    if text in gpus:
        return gpus[text]
    if not text[:1].isdigit():
        return "E503", f"unknown GPU '{text}'", did_you_mean(text, gpus) or f"known GPUs: {', '.join(gpus)}, or a memory size such as 24GiB"
    try:
        memory = parse_size(text)
    except ValueError as error:
        return (
            "E506",
            f"'{text}' is neither a GPU of specs/gpus.yaml nor a memory size: {error}",
            f"{SIZE_HELP}, or a catalog GPU such as {consts.default_gpu.key}",
        )
    if memory <= consts.cuda_context:
        return (
            "E506",
            f"a {text} GPU cannot hold the CUDA context ({consts.cuda_context // MIB} MiB, specs/gpus.yaml device.cuda_context_mib)",
            "give the GPU's whole memory, as nvidia-smi's memory.total shows it, e.g. 24GiB",
        )
    base = consts.default_gpu
    return Gpu(text, f"custom GPU, {base.key}'s {base.arch} constants", memory, base.arch, base.workspace, base.gemm_threads, base.workspace_blocks)


def catalog_constants(target: Gpu, dp: int) -> tuple[Constant, ...]:
    """The constants of specs/gpus.yaml an estimate on `target` at data-parallel degree `dp`
    used, each with the catalog's `source` text."""
    data = _catalog().data
    out = []
    for key, unit in (("cublas_workspace_kib", "KiB"), ("cublaslt_workspace_kib", "KiB"), ("gemm_threads", "threads")):
        entry = data["allocator"][key]
        arch = target.arch if target.arch in entry["value"] else f"default, for {target.arch}"
        out.append(Constant(f"specs/gpus.yaml allocator.{key} ({arch})", _per_arch(entry, target.arch), unit, " ".join(entry["source"].split())))
    for key in ("cuda_context_mib",) + (("nccl_per_communicator_mib",) if dp > 1 else ()):
        entry = data["device"][key]
        out.append(Constant(f"specs/gpus.yaml device.{key}", entry["value"], "MiB", " ".join(entry["source"].split())))
    return tuple(out)
