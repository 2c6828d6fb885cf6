"""Run an experiment's training steps on a real CUDA device and read what the device reports.

Contract: `measure(exp, steps=..., device="cuda")` builds the experiment's model exactly as
the tracer does (`harness.build_model`, `make_batch`, the optimizer; random weights, built
on the device), runs `steps` Trainer steps (`harness` module docstring) and returns a
`GpuMeasurement`. Each phase (forward, loss, backward, optimizer) reports
`torch.cuda.max_memory_allocated()` and `max_memory_reserved()` since the phase began (the
peak statistics are reset at every phase start) and NVML's used bytes at its end less the
idle baseline read before the process touched the device (`device`: what nvidia-smi shows
the job taking; the caching allocator releases nothing between phases, so the end of a
phase holds the phase's highest reservation). A `torch.cuda.OutOfMemoryError` ends the run;
it is reported with the step and phase where it happened and the peaks reached before it.

The counters are an object (`TorchCuda`) so that the step loop and the record can be
checked on a machine without a GPU (tests/test_measure_cuda.py gives it scripted figures).
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterator, Protocol

import torch

from . import harness, tricks
from .experiment import ExperimentError, check_measurable
from .tracer import BACKWARD, FORWARD, LOSS, OPTIMIZER, SETUP

PHASE_ORDER = (FORWARD, LOSS, BACKWARD, OPTIMIZER)
CUDA_NOTE = (
    "real CUDA steps with random weights, built by compiler.measure.harness (build_model, make_batch, the "
    "optimizer); allocated/reserved: torch.cuda max_memory_allocated/max_memory_reserved, reset at each "
    "phase start; device: NVML used bytes at each phase end minus the idle baseline ({baseline})"
)
SHARED_NOTE = "not read: other processes used the device at the same time (--shared-device), so NVML's used bytes were not this one's"


@dataclass(frozen=True)
class PhasePeak:
    allocated: int
    reserved: int
    device: int | None  # NVML used minus the idle baseline; None where NVML cannot be read


@dataclass(frozen=True)
class GpuStep:
    step: int
    phases: dict[str, PhasePeak]  # in PHASE_ORDER; a step cut short by an OOM has fewer

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: self.phases[p].allocated)

    @property
    def allocated(self) -> int:
        return max(p.allocated for p in self.phases.values())

    @property
    def reserved(self) -> int:
        return max(p.reserved for p in self.phases.values())

    @property
    def device(self) -> int | None:
        seen = [p.device for p in self.phases.values() if p.device is not None]
        return max(seen) if seen else None


@dataclass(frozen=True)
class OutOfMemory:
    step: int
    phase: str
    message: str  # the first line of torch's error


@dataclass(frozen=True)
class GpuMeasurement:
    steps: tuple[GpuStep, ...]
    accelerator: str
    total_memory: int
    baseline: int | None
    applied: tuple[str, ...]  # behaviours that differ from the experiment's letter (FA2 as SDPA)
    out_of_memory: OutOfMemory | None = None
    # with history: the caching allocator's own trace from before the model was built
    # (compiler.measure.history: (action, address, size[, where]), oldest first)
    history: tuple[tuple, ...] | None = None
    # cudaMalloc failures the allocator answered by freeing its cached blocks and retrying
    # (torch.cuda.memory_stats()["num_alloc_retries"] at the end of the run); None: not read
    alloc_retries: int | None = None
    # other processes used the device meanwhile (--shared-device): NVML was not read
    shared: bool = False


class Counters(Protocol):
    """What the step loop reads from the device."""

    oom_error: type[BaseException]

    def accelerator(self) -> tuple[str, int]: ...  # name, total bytes
    def baseline(self) -> int | None: ...
    def reset(self) -> None: ...
    def read(self) -> PhasePeak: ...
    def start_history(self, frames: bool = False) -> None: ...  # begin keeping every allocation and free (`frames`: where each was made)
    def history(self) -> tuple[tuple, ...]: ...  # what was kept; stops keeping
    def alloc_retries(self) -> int | None: ...  # the allocator's retries after freeing its cache


class TorchCuda:
    """torch.cuda's caching-allocator statistics and NVML's used bytes for one device."""

    oom_error = torch.cuda.OutOfMemoryError

    def __init__(self, device: torch.device, nvml: bool = True) -> None:
        self.device = device
        self.index = device.index if device.index is not None else 0
        self._nvml = nvml  # False: other processes share the device, its used bytes are not ours
        self._baseline = self._nvml_used() if nvml else None  # NB: before this process creates its CUDA context

    def accelerator(self) -> tuple[str, int]:
        props = torch.cuda.get_device_properties(self.index)
        return props.name, props.total_memory

    def baseline(self) -> int | None:
        return self._baseline

    def reset(self) -> None:
        torch.cuda.synchronize(self.index)
        torch.cuda.reset_peak_memory_stats(self.index)

    def alloc_retries(self) -> int | None:
        # NB: reset_peak_memory_stats leaves this counter alone; it counts from the process start
        return torch.cuda.memory_stats(self.index).get("num_alloc_retries")

    def read(self) -> PhasePeak:
        torch.cuda.synchronize(self.index)
        used = self._nvml_used() if self._nvml else None
        return PhasePeak(
            allocated=torch.cuda.max_memory_allocated(self.index),
            reserved=torch.cuda.max_memory_reserved(self.index),
            device=None if used is None or self._baseline is None else used - self._baseline,
        )

    # torch.cuda.memory._record_memory_history keeps this many trace entries (a ring): a 7B
    # model's three steps make a few hundred thousand allocations and frees. No tracebacks
    # (context None) unless `frames`: with them an entry is several KB and the snapshot takes
    # long to symbolize; the order and sizes are what a replay needs, the frames name what
    # each allocation was (history.where keeps one line of them).
    HISTORY_ENTRIES = 4_000_000

    def start_history(self, frames: bool = False) -> None:
        # NB: stacks "all": C++ frames too, the only ones an allocation on autograd's thread has
        torch.cuda.memory._record_memory_history("all", context="alloc" if frames else None, stacks="all", max_entries=self.HISTORY_ENTRIES)

    def history(self) -> tuple[tuple, ...]:
        from . import history

        torch.cuda.synchronize(self.index)
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        return tuple(history.events(snapshot, self.index))

    def _nvml_used(self) -> int | None:
        """NVML's used bytes (torch.cuda.device_memory_used, which maps CUDA_VISIBLE_DEVICES to
        NVML's index and needs nvidia-ml-py); else nvidia-smi's memory.used (MiB); else None."""
        try:
            return int(torch.cuda.device_memory_used(self.index))
        except Exception:  # noqa: BLE001 - no pynvml (ImportError) or NVML refused (pynvml.NVMLError_*)
            pass
        smi = shutil.which("nvidia-smi")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        target = visible[self.index].strip() if visible != [""] and self.index < len(visible) else str(self.index)
        if smi is None:
            return None
        try:
            out = subprocess.run(
                [smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits", f"--id={target}"], capture_output=True, text=True, timeout=10, check=True
            ).stdout
            return int(out.split()[0]) * 2**20
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None


def check_runnable(exp: dict) -> None:
    """What the CPU trace can stand in for but one real process cannot run."""
    check_measurable(exp)
    if exp["parallel"].get("fsdp"):
        raise ExperimentError(
            f"experiment {exp['experiment']!r}: FSDP needs one process per GPU (torchrun); "
            "--device cuda measures a single process (the CPU trace emulates the shards)"
        )


class _StepLog:
    """The counters read at each phase boundary of one run."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self.steps: list[GpuStep] = []
        self.step = 0
        self.phase: str | None = None
        self._phases: dict[str, PhasePeak] = {}

    def begin_step(self, step: int) -> None:
        self.step, self._phases = step, {}
        self.enter(FORWARD)

    def enter(self, phase: str) -> None:
        if self.phase is not None:
            self._phases[self.phase] = self.counters.read()
        self.phase = phase
        self.counters.reset()

    def end_step(self) -> None:
        self._phases[self.phase] = self.counters.read()
        self.steps.append(GpuStep(self.step, dict(self._phases)))
        self.phase = None

    def cut_short(self) -> None:
        """An OOM: the phase that failed still reports the peaks it reached."""
        if self.phase is not None:
            self.end_step()


class _Relabels:
    """MasterWeightOptimizer tells a tracer what its tensors are; no tracer runs on the device."""

    def relabel(self, tensors, category) -> None:
        return None


@contextlib.contextmanager
def _attention_kernel(exp: dict) -> Iterator[tuple[str, ...]]:
    """flash_attention_2 runs as SDPA pinned to the flash kernel (harness.ATTN_IMPLEMENTATION)."""
    if exp["attention"] != "flash_attention_2":
        yield ()
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        yield (harness.FA2_AS_SDPA,)


def measure(
    exp: dict,
    *,
    steps: int = 3,
    device: str = "cuda",
    counters: Counters | None = None,
    history: bool = False,
    shared: bool = False,
    frames: bool = False,
) -> GpuMeasurement:
    """Run `steps` training steps of `exp` on `device`; see the module docstring. `history`:
    keep the caching allocator's trace of every allocation and free, from the model's build on
    (`GpuMeasurement.history`; `frames`: each allocation with where it was made). `shared`: other processes use the device meanwhile, so NVML's
    used bytes are not read (allocated and reserved are this process's own either way)."""
    check_runnable(exp)
    _use_alloc_conf(exp)
    if steps < harness.MIN_STEPS:
        raise ValueError(f"at least {harness.MIN_STEPS} steps: step 1 creates the optimizer states")
    where = torch.device(device)
    if counters is None:
        if not torch.cuda.is_available():
            raise ExperimentError(f"--device {device}: torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)")
        counters = TorchCuda(where, nvml=not shared)
    name, total = counters.accelerator()
    config = harness.load_config(exp["config"])
    log = _StepLog(counters)
    if history:
        counters.start_history(frames)
    try:
        with where:
            model = harness.build_model(config, exp)
        batch = {k: (v.to(where) if isinstance(v, torch.Tensor) else v) for k, v in harness.make_batch(config, exp).items()}
    except counters.oom_error as exc:
        # NB: the weights alone do not fit; the highest reached stands as step 0's setup phase
        log.steps.append(GpuStep(0, {SETUP: counters.read()}))
        return GpuMeasurement(
            tuple(log.steps),
            name,
            total,
            counters.baseline(),
            (),
            OutOfMemory(0, SETUP, _first_line(exc)),
            counters.history() if history else None,
            counters.alloc_retries(),
            shared,
        )
    if harness.autocast(exp):
        harness.wrap_forward_as_accelerate(model, harness.DTYPES[exp["precision"]], where.type)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer, scale = harness._make_optimizer(exp, model, trainable, _Relabels())

    def enter_loss(*_):
        if log.phase == FORWARD:
            log.enter(LOSS)

    # NB: as the tracer's harness: BLIP-2 keeps its head inside the language model
    head = model.lm_head if hasattr(model, "lm_head") else model.get_output_embeddings()
    head.register_forward_hook(enter_loss)
    applied: tuple[str, ...] = ()
    if exp.get("loss") == "fused_linear_cross_entropy":
        harness._check_fused_loss(exp)
        tricks.install_fused_loss(model, enter_loss)
        applied += (tricks.FUSED_LOSS,)
    offload = bool(exp.get("activation_offloading"))
    oom = None
    with _attention_kernel(exp) as pinned:
        applied += pinned
        for step in range(1, steps + 1):
            try:
                _train_step(step, model, batch, optimizer, scale, log, offload)
            except counters.oom_error as exc:
                oom = OutOfMemory(step, log.phase or FORWARD, _first_line(exc))
                log.cut_short()
                break
    return GpuMeasurement(
        tuple(log.steps), name, total, counters.baseline(), applied, oom, counters.history() if history else None, counters.alloc_retries(), shared
    )


def _use_alloc_conf(exp: dict) -> None:
    """Run under the experiment's PYTORCH_CUDA_ALLOC_CONF (its `alloc_conf`, else torch's
    defaults), set before the step's first allocation: the record says what ran. One set in
    the environment that the experiment does not name is refused, not recorded as defaults."""
    conf = exp.get("alloc_conf") or ""
    outside = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if outside and outside != conf:
        raise ExperimentError(
            f"experiment {exp['experiment']!r}: PYTORCH_CUDA_ALLOC_CONF={outside!r} is set in the environment and the experiment "
            f"runs under {conf or 'torch defaults'!r}: unset it, or name it in the experiment's alloc_conf (--alloc-conf)"
        )
    if conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
        # NB: the environment is read once, when the allocator's configuration is first made
        # (possibly before this); the setter parses the text again (c10 AllocatorConfig)
        setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
        if setter is not None:
            setter(conf)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _train_step(step: int, model, batch: dict, optimizer, scale: float, log: _StepLog, offload: bool) -> None:
    """One Trainer step as harness._train_step runs it, the counters read at each phase."""
    log.begin_step(step)
    with torch.autograd.graph.save_on_cpu(pin_memory=False) if offload else contextlib.nullcontext():
        loss = model(**batch).loss  # the output object (logits) dies here
    log.enter(BACKWARD)
    (loss * scale if scale != 1.0 else loss).backward()
    del loss
    log.enter(OPTIMIZER)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    log.end_step()


def machine(m: GpuMeasurement) -> dict:
    baseline = SHARED_NOTE if m.shared else "not readable" if m.baseline is None else f"{m.baseline:,} B"
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "accelerator": m.accelerator,
        "note": CUDA_NOTE.format(baseline=baseline),
    }
