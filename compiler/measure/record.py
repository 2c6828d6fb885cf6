"""Measured records: build, write, read and validate `memspec/measured/v1` JSON files.

Contract: `build_record(name, exp, measurement)` returns the record mapping (bytes as
integers, the experiment with its defaults, the software versions and the machine);
`build_gpu_record(name, exp, measurement, sha)` the same for a run on a real GPU
(`cuda.GpuMeasurement`: allocated, reserved and device per phase, an out-of-memory with where
it happened); `write_record` writes it as stable, indented JSON; `validate(record)` returns the schema
violations as `$.path: message` strings (empty when valid). Only `build_record` needs the
measurement's torch-free dataclasses; nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from ..memory.allocator import SEGMENTS_DESCENDING
from .experiment import to_record


def older_replay(record: dict) -> bool:
    """A traced record whose reserved was replayed before the rules of the GPU allocator
    histories (its `emulation` lacks them); a GPU's own record never is."""
    return record.get("source") != SOURCE_GPU and bool(record.get("emulation")) and SEGMENTS_DESCENDING not in record["emulation"]


SCHEMA_ID = "memspec/measured/v1"
SOURCE_CPU_TRACE = "cpu-trace"
SOURCE_GPU = "gpu"
PACKAGES = ("torch", "transformers", "peft")


def versions() -> dict[str, str]:
    out = {}
    for package in PACKAGES:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    out["python"] = platform.python_version()
    return out


def machine() -> dict[str, Any]:
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "accelerator": None,
        "note": "fake tensors on the CPU; no device memory is touched",
    }


def _step(step) -> dict[str, Any]:
    return {
        "step": step.step,
        "allocated": step.allocated,
        "traced": step.traced,
        "phase": step.phase,
        "op": step.op,
        "module": step.module,
        "breakdown": dict(step.breakdown),
        "phases": step.phases,
    }


def steady_state(steps: list[dict]) -> dict:
    """The highest step after the first (the first also creates the optimizer states)."""
    return max(steps[1:], key=lambda s: s["allocated"])


def build_record(name: str, exp: dict, measurement, config_sha256: str) -> dict[str, Any]:
    steps = [_step(s) for s in measurement.steps]
    record = {
        "schema": SCHEMA_ID,
        "name": name,
        "experiment": to_record(exp),
        "model_config_sha256": config_sha256,
        "source": SOURCE_CPU_TRACE,
        "versions": versions(),
        "machine": machine(),
        "emulation": list(measurement.emulation),
        "steps": steps,
        "allocated": steady_state(steps)["allocated"],
        "allocated_first_step": steps[0]["allocated"],
        "reserved": measurement.reserved,
        "device": None,
    }
    if getattr(measurement, "devices", None):
        # device_map: each GPU's peak; the record's figures are the largest GPU's
        peaks = measurement.devices
        gpus = sorted({g for highs in peaks.values() for g in highs})
        reserved = getattr(measurement, "device_reserved", None) or {}
        record["devices"] = [
            {
                "gpu": g,
                "allocated": max(peaks[s].get(g, 0) for s in peaks if s >= 2),
                "allocated_first_step": peaks.get(1, {}).get(g, 0),
                **({"reserved": reserved[g]} if g in reserved else {}),
            }
            for g in gpus
        ]
        record["allocated"] = max(d["allocated"] for d in record["devices"])
        record["allocated_first_step"] = max(d["allocated_first_step"] for d in record["devices"])
        # NB: each GPU's own allocator; the record's reserved is the largest GPU's
        record["reserved"] = max(reserved.values()) if reserved else None
    return record


def gpu_key(accelerator: str, total_memory: int) -> str | None:
    """The specs/gpus.yaml key of the device torch names. NB: by name only (each catalog name
    is one memory size: "NVIDIA A100-SXM4-40GB"); the CUDA runtime's total_memory need not
    equal nvidia-smi's memory.total, which the catalog holds. Read with yaml alone, so that a
    GPU machine with torch and transformers but no jsonschema still writes its records."""
    import yaml

    from ..paths import specs_dir

    gpus = (yaml.safe_load((specs_dir() / "gpus.yaml").read_text(encoding="utf-8")) or {}).get("gpus") or {}
    return next((key for key, gpu in gpus.items() if isinstance(gpu, dict) and gpu.get("name") == accelerator), None)


def _gpu_step(step) -> dict[str, Any]:
    return {
        "step": step.step,
        "allocated": step.allocated,
        "reserved": step.reserved,
        "device": step.device,
        "phase": step.peak_phase,
        "phases": {name: {"allocated": p.allocated, "reserved": p.reserved, "device": p.device} for name, p in step.phases.items()},
    }


def build_gpu_record(name: str, exp: dict, measurement, config_sha256: str) -> dict[str, Any]:
    """`allocated` is the steady state, the highest over steps >= 2 (as `steady_state`);
    `reserved` and `device` are the run's highest, step 1 included, as a cpu-trace record's
    reserved and the estimate's: the allocator gives nothing back between steps unless it
    frees its cache to retry a failed cudaMalloc (`alloc_retries`), and then step 1's
    reservation is what the job held. A run cut short by an out-of-memory keeps the highest
    it reached (a lower bound of what it needed)."""
    from .cuda import machine

    steps = [_gpu_step(s) for s in measurement.steps]
    steady = steps[1:] or steps
    experiment = to_record(exp)
    key = gpu_key(measurement.accelerator, measurement.total_memory)
    if key is not None:
        experiment["gpu"] = key

    def highest(measure: str, over: list[dict]) -> int | None:
        seen = [s[measure] for s in over if s[measure] is not None]
        return max(seen) if seen else None

    record = {
        "schema": SCHEMA_ID,
        "name": name,
        "experiment": experiment,
        "model_config_sha256": config_sha256,
        "source": SOURCE_GPU,
        "versions": versions(),
        "machine": machine(measurement),
        "emulation": list(measurement.applied),
        "steps": steps,
        "allocated": highest("allocated", steady) or 0,
        "allocated_first_step": steps[0]["allocated"] if steps and (len(steps) > 1 or measurement.out_of_memory is None) else None,
        "reserved": highest("reserved", steps),
        "device": highest("device", steps),
    }
    if measurement.alloc_retries is not None:
        record["alloc_retries"] = measurement.alloc_retries
    oom = measurement.out_of_memory
    if oom is not None:
        record["out_of_memory"] = {"step": oom.step, "phase": oom.phase, "message": oom.message}
    return record


def write_record(record: dict, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # NB: atomic, so an interrupted matrix run never leaves half a record


def read_record(path: str | Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def validate(record: dict) -> list[str]:
    """What keeps `record` from the measured-record schema, as `memspec validate` reads it (the
    same validator: a byte count of 4096.0 is refused, which plain Draft 2020-12 accepts)."""
    from ..pipeline.validate import schema_validator

    errors = sorted(schema_validator("measured").iter_errors(record), key=lambda e: list(e.absolute_path))
    return [f"{e.json_path}: {e.message}" for e in errors]
