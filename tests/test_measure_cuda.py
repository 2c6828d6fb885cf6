"""`memspec measure --device`: the step loop, the phase readings and the record, checked on the
CPU with counters that give scripted figures (the real ones come from torch.cuda and NVML)."""

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="measuring needs torch")
pytest.importorskip("transformers", reason="measuring needs transformers")

from compiler.measure import cuda, harness, record  # noqa: E402
from compiler.measure.__main__ import run  # noqa: E402
from compiler.measure.experiment import ExperimentError, load_experiment, with_overrides  # noqa: E402
from compiler.commands.validation import compare, verdicts  # noqa: E402

TINY = Path(__file__).parent / "measured" / "tiny"
MIB = 2**20
H100 = ("NVIDIA H100 80GB HBM3", 81559 * MIB)  # torch's name and total_memory for specs/gpus.yaml h100-80gb
BASELINE = 503_316_480  # NVML used on the idle card
CONTEXT = 800_000_000  # what the process adds beyond the caching allocator


class Scripted:
    """Reading n (1, 2, ...) reports allocated n * 1000, reserved n * 1000 + 512 and NVML used
    baseline + context + reserved; entering `oom_at` (step, phase) raises the OOM there."""

    oom_error = torch.cuda.OutOfMemoryError

    def __init__(self, oom_at=None, accelerator=H100):
        self.n = 0
        self.oom_at = oom_at
        self.log = None
        self._accelerator = accelerator

    def accelerator(self):
        return self._accelerator

    def baseline(self):
        return BASELINE

    def reset(self):
        if self.oom_at is not None and self.log is not None and (self.log.step, self.log.phase) == self.oom_at:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nmore text")

    def read(self):
        self.n += 1
        reserved = self.n * 1000 + 512
        return cuda.PhasePeak(self.n * 1000, reserved, BASELINE + CONTEXT + reserved - BASELINE)

    def alloc_retries(self):
        return 0

    def start_history(self, frames=False):
        self.frames = frames
        self.kept = [("segment_alloc", 1 << 20, 2 << 20), ("alloc", 1 << 20, 512)]

    def history(self):
        return tuple(self.kept)


@pytest.fixture
def attach(monkeypatch):
    """Lets the scripted counters see the step log, so they can raise inside a phase."""
    made = []
    real = cuda._StepLog.__init__

    def init(self, counters):
        real(self, counters)
        counters.log = self
        made.append(self)

    monkeypatch.setattr(cuda._StepLog, "__init__", init)
    return made


def tiny(name="tiny-finetune", **overrides):
    return with_overrides(load_experiment(TINY / f"{name}.yaml"), **overrides)


def test_each_phase_gets_its_own_reading_and_the_record_takes_steps_2_on(attach):
    exp = tiny()
    m = cuda.measure(exp, steps=3, device="cpu", counters=Scripted())
    assert [s.step for s in m.steps] == [1, 2, 3]
    assert [list(s.phases) for s in m.steps] == [["forward", "loss", "backward", "optimizer"]] * 3
    # readings 1..4 are step 1's phases in order, 5..8 step 2's, 9..12 step 3's
    assert [p.allocated for s in m.steps for p in s.phases.values()] == [n * 1000 for n in range(1, 13)]
    rec = record.build_gpu_record("tiny", exp, m, harness.config_sha256(exp["config"]))
    assert record.validate(rec) == []
    assert rec["source"] == "gpu" and "out_of_memory" not in rec
    assert rec["experiment"]["gpu"] == "h100-80gb"  # matched by name
    assert (rec["allocated"], rec["allocated_first_step"]) == (12_000, 4_000)
    assert rec["reserved"] == 12_512
    assert rec["device"] == 12_512 + CONTEXT
    assert rec["steps"][1]["phase"] == "optimizer"
    assert rec["steps"][1]["phases"]["loss"] == {"allocated": 6000, "reserved": 6512, "device": 6512 + CONTEXT}
    assert f"{BASELINE:,} B" in rec["machine"]["note"] and rec["machine"]["accelerator"] == H100[0]


def test_an_autocast_step_computes_in_16_bits_on_the_device_it_runs_on(attach, monkeypatch):
    # bf16-mixed as HF Trainer and accelerate run it: fp32 weights, torch.autocast of the
    # model's device around the forward. An autocast of another device type (the trace's CPU
    # one on a CUDA model) leaves every matmul in fp32, and the record would measure an fp32
    # step under a bf16-mixed name.
    seen = []
    build = harness.build_model

    def watched(config, exp):
        model = build(config, exp)
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.register_forward_hook(lambda mod, args, out: seen.append((mod.weight.dtype, out.dtype)))
        return model

    monkeypatch.setattr(harness, "build_model", watched)
    cuda.measure(tiny("tiny-autocast"), steps=2, device="cpu", counters=Scripted())
    assert seen and set(seen) == {(torch.float32, torch.bfloat16)}


class Released(Scripted):
    """Step 1's optimizer phase (reading 4) reserves 9,000,512 B; a failed cudaMalloc then
    made the allocator free its cache (one retry), so the later steps reserve less."""

    def read(self):
        peak = super().read()
        if self.n == 4:
            return cuda.PhasePeak(peak.allocated, 9_000_512, peak.device)
        return peak

    def alloc_retries(self):
        return 1


def test_reserved_is_the_runs_highest_when_the_allocator_freed_its_cache(attach):
    exp = tiny()
    m = cuda.measure(exp, steps=3, device="cpu", counters=Released())
    rec = record.build_gpu_record("tiny", exp, m, harness.config_sha256(exp["config"]))
    assert record.validate(rec) == []
    # allocated is the steady state (reading 12); reserved is step 1's 9,000,512 B, above
    # step 3's 12,512 B: what the job held on this card
    assert (rec["allocated"], rec["reserved"], rec["alloc_retries"]) == (12_000, 9_000_512, 1)
    assert rec["steps"][0]["reserved"] == 9_000_512 and rec["steps"][2]["reserved"] == 12_512


def test_an_unknown_card_is_recorded_without_a_catalog_key(attach):
    exp = tiny()
    m = cuda.measure(exp, steps=2, device="cpu", counters=Scripted(accelerator=("NVIDIA GH200 480GB", 96 * 2**30)))
    rec = record.build_gpu_record("tiny", exp, m, harness.config_sha256(exp["config"]))
    assert "gpu" not in rec["experiment"] and record.validate(rec) == []


def test_an_out_of_memory_ends_the_run_and_says_where(attach):
    exp = tiny()
    m = cuda.measure(exp, steps=3, device="cpu", counters=Scripted(oom_at=(2, "backward")))
    assert m.out_of_memory == cuda.OutOfMemory(2, "backward", "CUDA out of memory. Tried to allocate 2.00 GiB.")
    # step 1 whole (readings 1-4); step 2: forward 5, loss 6, and backward read when it failed (7)
    assert [list(s.phases) for s in m.steps] == [["forward", "loss", "backward", "optimizer"], ["forward", "loss", "backward"]]
    rec = record.build_gpu_record("tiny", exp, m, harness.config_sha256(exp["config"]))
    assert record.validate(rec) == []
    assert rec["out_of_memory"] == {"step": 2, "phase": "backward", "message": "CUDA out of memory. Tried to allocate 2.00 GiB."}
    assert (rec["allocated"], rec["allocated_first_step"], rec["reserved"]) == (7_000, 4_000, 7_512)


def test_an_out_of_memory_in_the_first_step_leaves_no_first_step_figure(attach):
    exp = tiny()
    m = cuda.measure(exp, steps=3, device="cpu", counters=Scripted(oom_at=(1, "loss")))
    rec = record.build_gpu_record("tiny", exp, m, harness.config_sha256(exp["config"]))
    assert record.validate(rec) == []
    assert (rec["allocated"], rec["allocated_first_step"]) == (2_000, None)


def test_weights_that_do_not_fit_are_an_out_of_memory_at_setup(attach, monkeypatch):
    def no_room(config, exp):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 500.00 MiB.")

    monkeypatch.setattr(harness, "build_model", no_room)
    exp = tiny()
    m = cuda.measure(exp, steps=3, device="cpu", counters=Scripted())
    assert m.out_of_memory == cuda.OutOfMemory(0, "setup", "CUDA out of memory. Tried to allocate 500.00 MiB.")
    rec = record.build_gpu_record("tiny", exp, m, harness.config_sha256(exp["config"]))
    assert record.validate(rec) == []
    assert rec["steps"][0]["phase"] == "setup" and rec["allocated"] == 1000


def test_fsdp_is_refused_with_the_reason():
    exp = tiny()
    exp = {**exp, "parallel": {"dp": 1, "zero": 0, "fsdp": {"reshard_after_forward": True}}}
    with pytest.raises(ExperimentError, match="FSDP needs one process per GPU"):
        cuda.check_runnable(exp)


def test_validate_checks_the_verdict_of_an_out_of_memory_record(tmp_path):
    """A GPU record that ran out of memory is left out of the errors; an estimate that says
    "fits" for it is a missed OOM. LLaVA-1.5-7B finetune, all of it trained, unsharded, on
    one H100: the weights, gradients and Adam states alone are 16 B a parameter, ~113 GB."""
    base = json.loads((Path("tests/measured/gpu/llava-1.5-7b-pretrain_unsharded.json")).read_text())
    oom = dict(base, name="oom", out_of_memory={"step": 1, "phase": "optimizer", "message": "CUDA out of memory."})
    oom["experiment"] = dict(base["experiment"], trainable=["projector", "language"], experiment="oom")
    (tmp_path / "oom.json").write_text(json.dumps(oom))
    c = compare(tmp_path / "oom.json")
    assert c.out_of_memory and c.fits is False and c.error("allocated") is None
    assert verdicts([c]).missed == ()
    # the same OOM on a setup the estimate says fits (projector-only at b 4, 55 GB on 80) is a miss
    fitting = json.loads((Path("tests/measured/gpu/llava-1.5_7b_proj_b4_s2048_sdpa_gc-off.json")).read_text())
    missed = dict(fitting, name="missed", out_of_memory={"step": 2, "phase": "backward", "message": "CUDA out of memory."})
    (tmp_path / "missed.json").write_text(json.dumps(missed))
    m = compare(tmp_path / "missed.json")
    assert m.fits is True and verdicts([c, m]).missed == ("missed",)


def test_cli_device_errors_are_clear(capsys, tmp_path):
    with pytest.raises(SystemExit) as bad:
        run([str(TINY / "tiny-finetune.yaml"), "--device", "gpu0"])
    assert bad.value.code == 2 and "give cuda or cuda:N" in capsys.readouterr().err
    assert run([str(TINY / "tiny-finetune.yaml"), "--device", "cuda", "--timeline", str(tmp_path / "t")]) == 2
    assert "come from the trace" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert run([str(TINY / "tiny-finetune.yaml"), "--device", "cuda"]) == 1
        assert "sees no CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure path of a machine without a GPU")
def test_a_matrix_on_the_device_measures_each_entry_in_its_own_process(tmp_path, capsys):
    """Each entry runs in a spawned process (a fresh allocator and NVML baseline); one that
    fails is named and the run exits 1, with no record written for it."""
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f"matrix: m\nbase: {{model: {TINY / 'tiny-llava.yaml'}, seq_len: 48, trainable: [projector]}}\naxes: {{micro_batch: [1, 2]}}\n")
    assert run(["--matrix", str(matrix), "-o", str(tmp_path / "out"), "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert "2 failed: m_b1, m_b2" in err
    assert not list((tmp_path / "out").glob("*.json"))


def test_the_allocators_history_is_kept_from_the_models_build_on(attach):
    """--memory-history: the counters start keeping before the model is built and hand the
    trace back with the measurement; without it there is none."""
    m = cuda.measure(tiny(), steps=2, device="cpu", counters=Scripted(), history=True)
    assert m.history == (("segment_alloc", 1 << 20, 2 << 20), ("alloc", 1 << 20, 512))
    assert cuda.measure(tiny(), steps=2, device="cpu", counters=Scripted()).history is None


def test_the_step_runs_under_the_experiments_allocator_settings(attach, monkeypatch):
    """alloc_conf: PYTORCH_CUDA_ALLOC_CONF is set, and parsed again, before the model's build
    allocates, and the record keeps it; a setting in the environment that the experiment does
    not name is refused rather than recorded as torch's defaults."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")  # NB: undone after the test, as measuring sets it
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    parsed = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", parsed.append, raising=False)
    exp = tiny(alloc_conf="expandable_segments:True")
    m = cuda.measure(exp, steps=2, device="cpu", counters=Scripted())
    assert parsed == ["expandable_segments:True"] == [os.environ["PYTORCH_CUDA_ALLOC_CONF"]]
    assert record.build_gpu_record("r", exp, m, harness.config_sha256(exp["config"]))["experiment"]["alloc_conf"] == "expandable_segments:True"
    with pytest.raises(ExperimentError, match="PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True' is set in the environment"):
        cuda.measure(tiny(), steps=2, device="cpu", counters=Scripted())


def test_a_traced_step_keeps_the_allocator_models_history(capsys, tmp_path):
    """--memory-history without --device: the tracer's sequence as the allocator model was given
    it, in a GPU history's actions; replayed it reserves the record's figure to the byte, and
    `memspec validate --history` lines the record's estimate up with it as with a GPU's."""
    from compiler.cli import main
    from compiler.measure import history

    out, kept = tmp_path / "r.json", tmp_path / "r.history.jsonl.gz"
    assert run([str(TINY / "tiny-finetune.yaml"), "--steps", "3", "-o", str(out), "--memory-history", str(kept)]) == 0
    rec, events = json.loads(out.read_text()), history.read(kept)
    replayed = history.replay(events)
    assert replayed.model_reserved == replayed.gpu_reserved == rec["reserved"] and replayed.unmatched_frees == 0
    assert sum(1 for a, *_ in events if a == "alloc") == replayed.allocations > 0
    # NB: every allocation says what it is (MemoryTracer.describe): the weights as registered,
    # a layer's activation by its op and module, the optimizer's states in its step
    allocs = [e for e in events if e[0] == "alloc"]
    assert all(len(e) == 4 and e[3] for e in allocs)
    assert allocs[0][3] == "register (parameters) in the model, step 0 setup"
    made = {e[3] for e in allocs}
    assert "addmm.default (activations) in model.vision_tower.encoder.layers.0.self_attn.q_proj, step 1 forward" in made
    assert any(m.startswith("zeros_like.default (optimizer_") and m.endswith("in optimizer, step 1 optimizer") for m in made)
    capsys.readouterr()
    assert main(["validate", str(out), "--history", str(kept), "--min-mib", "0"]) == 0
    shown = capsys.readouterr().out
    assert "r.history.jsonl.gz: the trace reserved 0.07 GiB (the allocator model on its sequence +0.00 %)" in shown
    # the one small-pool segment only the trace opens, for the optimizer's sqrt copies
    assert (
        "trace only: 2.00 MiB for a 0.02 MiB request at allocation 658 (_foreach_sqrt.default (optimizer_temporaries) in optimizer, step 1 optimizer)" in shown
    )


def test_a_gpus_history_keeps_its_frames_only_when_asked(attach, capsys):
    """--memory-history-frames: the counters keep each entry's frames (history.where names it);
    without --device and --memory-history it is a usage error, as there is no GPU history to name."""
    counters = Scripted()
    cuda.measure(tiny(), steps=2, device="cpu", counters=counters, history=True, frames=True)
    assert counters.frames is True
    cuda.measure(tiny(), steps=2, device="cpu", counters=counters, history=True)
    assert counters.frames is False
    assert run([str(TINY / "tiny-finetune.yaml"), "--memory-history-frames"]) == 2
    assert "--memory-history-frames keeps where each of a GPU's allocations was made; it needs --device cuda and --memory-history PATH" in (
        capsys.readouterr().err
    )


def test_shared_device_records_no_device_figure_and_says_why(attach):
    """--shared-device: NVML's used bytes count every process on the GPU, so a run that shares
    it reads none (allocated and reserved are the process's own either way)."""
    m = cuda.measure(tiny(), steps=2, device="cpu", counters=Scripted(), shared=True)
    assert m.shared and "--shared-device" in cuda.machine(m)["note"]
    assert not cuda.measure(tiny(), steps=2, device="cpu", counters=Scripted()).shared


def test_shared_device_needs_a_device(capsys):
    assert run([str(TINY / "tiny-finetune.yaml"), "--shared-device"]) == 2
    assert "needs --device cuda" in capsys.readouterr().err


def test_jobs_needs_a_matrix_on_a_device(capsys, tmp_path):
    assert run([str(TINY / "tiny-finetune.yaml"), "--device", "cuda", "--jobs", "2"]) == 2
    assert "--jobs N" in capsys.readouterr().err
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f"matrix: m\nbase: {{model: {TINY / 'tiny-llava.yaml'}, seq_len: 48, trainable: [projector]}}\naxes: {{micro_batch: [1, 2]}}\n")
    assert run(["--matrix", str(matrix), "-o", str(tmp_path / "out"), "--jobs", "2"]) == 2
    assert run(["--matrix", str(matrix), "-o", str(tmp_path / "out"), "--device", "cuda", "--jobs", "0"]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure path of a machine without a GPU")
def test_jobs_run_the_entries_side_by_side_and_name_each_that_failed(tmp_path, capsys):
    """--jobs 3 over two entries: both start at once, each in a process of its own; each that
    fails is named and the run exits 1, with no record written for it."""
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f"matrix: m\nbase: {{model: {TINY / 'tiny-llava.yaml'}, seq_len: 48, trainable: [projector]}}\naxes: {{micro_batch: [1, 2]}}\n")
    assert run(["--matrix", str(matrix), "-o", str(tmp_path / "out"), "--device", "cuda", "--jobs", "3"]) == 1
    err = capsys.readouterr().err
    assert "m_b1: the measuring process failed" in err and "m_b2: the measuring process failed" in err
    assert "2 failed: m_b1, m_b2" in err
    assert not list((tmp_path / "out").glob("*.json"))


def test_a_record_check_refuses_a_byte_count_written_as_a_float():
    """record.validate applies memspec's own validator, whose integers are whole numbers
    written as one: a record with reserved 4096.0 is refused there as `memspec validate`
    refuses it (plain Draft 2020-12 takes 4096.0 as an integer)."""
    exp = tiny()
    m = cuda.measure(exp, steps=3, device="cpu", counters=Scripted())
    rec = record.build_gpu_record("tiny", exp, m, harness.config_sha256(exp["config"]))
    assert record.validate(rec) == []
    rec["reserved"] = float(rec["reserved"])
    assert record.validate(rec) == ["$.reserved: 12512.0 is not of type 'integer', 'null'"]
