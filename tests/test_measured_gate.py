"""The verdict of measured memory on every formula: `memspec validate` over tests/measured/.

The thresholds live in tests/measured/thresholds.yaml and only ever tighten.
"""

from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from compiler.commands.validation import as_data, gate, margin_checks, render, validate_records, verdicts
from compiler.pipeline.resolve import gpu_catalog

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "tests" / "measured"


@pytest.fixture(scope="module")
def everything():
    return validate_records([MEASURED])


@pytest.fixture(scope="module")
def comparisons(everything):
    return [c for c in everything if c.source != "gpu"]


@pytest.fixture(scope="module")
def gpu(everything):
    return [c for c in everything if c.source == "gpu"]


def test_records_exist_and_are_estimated(comparisons):
    assert len(comparisons) >= 1
    assert any(c.estimated is not None for c in comparisons)


def test_every_record_was_traced_under_the_gpu_histories_rules(comparisons):
    """A record traced before the replay took the GPU allocator histories' rules
    (measure.record.older_replay) is summarised apart by `validate`; every committed one has
    been traced again under them."""
    assert [c.name for c in comparisons if c.older_replay] == []


@pytest.mark.parametrize("measure", ["allocated", "reserved"])
def test_gate(comparisons, measure):
    limits = yaml.safe_load((MEASURED / "thresholds.yaml").read_text())[measure]
    # NB: the autocast records are in the allocated gate; their reserved has its own (below)
    gated = comparisons
    if measure != "allocated":
        gated = [c for c in comparisons if not c.autocast]
    failures = gate(
        gated,
        limits["max_mape_pct"],
        limits["max_worst_pct"],
        limits["max_under_estimates"],
        "allocated" if measure == "allocated" else "reserved",
        limits.get("under_tolerance_pct", 0.0),
    )
    assert failures == [], render(gated)


@pytest.mark.parametrize("measure", ["allocated", "reserved"])
def test_autocast_gate(comparisons, measure):
    """bf16-mixed as torch.autocast on fp32 weights: every record estimated (none refused),
    allocated within the main gate, reserved within its own."""
    autocast = [c for c in comparisons if c.autocast]
    assert len(autocast) >= 28 and all(c.estimated is not None for c in autocast), render(autocast)
    limits = yaml.safe_load((MEASURED / "thresholds.yaml").read_text())["autocast"][measure]
    failures = gate(autocast, limits["max_mape_pct"], limits["max_worst_pct"], limits["max_under_estimates"], measure)
    assert failures == [], render(autocast)


@pytest.mark.parametrize("measure", ["allocated", "reserved", "device"])
def test_gpu_gate(gpu, measure):
    assert len(gpu) >= 9
    limits = yaml.safe_load((MEASURED / "thresholds.yaml").read_text())["gpu"][measure]
    failures = gate(gpu, limits["max_mape_pct"], limits["max_worst_pct"], limits["max_under_estimates"], measure, limits.get("under_tolerance_pct", 0.0))
    assert failures == [], render(gpu)


def test_no_gpu_run_that_ran_out_of_memory_is_answered_fits(gpu):
    """The verdict on each GPU record's own card: an OOM the estimate calls "fits" is the
    failure memspec exists to prevent (the records of fit's boundary are checked this way)."""
    v = verdicts(gpu)
    assert v is not None and v.count == len(gpu)
    assert v.missed == (), render(gpu)


def test_an_under_tolerance_counts_only_the_larger_unders():
    from compiler.commands.validation import Comparison

    def record(name, estimated):  # measured 1000 B: the error is (estimated - 1000) / 10 percent
        return Comparison(name, name, "cpu-trace", {"reserved": 1000}, {"reserved": estimated})

    records = [record("a", 990), record("b", 970), record("c", 1050)]  # -1 %, -3 %, +5 %
    assert gate(records, None, None, 1, "reserved") == ["2 estimate(s) below the measurement (at most 1 allowed)"]
    assert gate(records, None, None, 1, "reserved", under_tolerance=2.0) == []
    assert gate(records, None, None, 0, "reserved", under_tolerance=2.0) == ["1 estimate(s) below the measurement by more than 2.0% (at most 0 allowed)"]


def test_a_record_replayed_before_the_gpu_rules_is_summarised_apart():
    """A traced record whose `emulation` lacks the GPU allocator histories' rules keeps the
    reserved of the older replay: validate prints its reserved on a row of its own."""
    from compiler.commands.validation import Comparison
    from compiler.measure.record import older_replay
    from compiler.memory.allocator import SEGMENTS_DESCENDING

    assert older_replay({"emulation": ["cublas-workspace-per-thread"]})
    assert not older_replay({"emulation": ["cublas-workspace-per-thread", SEGMENTS_DESCENDING]})
    assert not older_replay({"emulation": [], "source": "gpu"})  # a GPU's own record
    assert not older_replay({"emulation": ["flash_attention_2-measured-as-sdpa-flash"], "source": "gpu"})  # its kernel named
    measured = {"allocated": 1000, "reserved": 1000}
    new = Comparison("new", "new", "cpu-trace", measured, {"allocated": 1000, "reserved": 990})  # -1 %
    old = Comparison("old", "old", "cpu-trace", measured, {"allocated": 1000, "reserved": 950}, older_replay=True)  # -5 %
    summary = render([new, old]).splitlines()
    assert any(line.startswith("reserved              n=1    MAPE 1.00%") for line in summary), summary
    assert any(line.startswith("reserved, old replay  n=1    MAPE 5.00%") for line in summary), summary


def test_the_default_margin_covers_every_gpu_record(gpu):
    """specs/gpus.yaml device.margin_pct is the worst under-estimate measured on a real GPU,
    per kind of step (without checkpointing; checkpointed; checkpointed with eager attention;
    a packed batch; under expandable_segments:True):
    no GPU record's allocated, reserved or device figure is estimated further below its
    measurement than its kind's margin, and each margin is no wider than that needs (the
    worst record of its kind within one percentage point of it)."""
    consts = gpu_catalog()[1]
    assert consts.margin.percent == 2 and consts.margin.source == "specs/gpus.yaml device.margin_pct"
    assert [consts.margin_for(True, a).percent for a in ("sdpa", "flash_attention_2", "eager")] == [Fraction(4), Fraction(4), Fraction(1)]
    # a packed batch, checkpointed or not, whatever its attention
    assert {consts.margin_for(c, a, packed=True).percent for c in (False, True) for a in ("sdpa", "eager")} == {Fraction(14)}
    # under expandable_segments:True one margin, whatever the kind of step
    assert {consts.margin_for(c, a, True).percent for c in (False, True) for a in ("sdpa", "eager")} == {Fraction(2)}
    gate = yaml.safe_load((MEASURED / "thresholds.yaml").read_text())["gpu"]
    # the gate lets an allocated figure be off by at most 1 % either way: the plain margin covers it
    assert consts.margin.percent >= Fraction(str(gate["allocated"]["max_worst_pct"]))
    # NB: here, not in test_gpus.py: the module's one validation of every record serves it
    comparisons = gpu
    checks = margin_checks(comparisons)
    assert all(k.covered for k in checks), [(k.margin.text, k.worst) for k in checks if not k.covered]
    # Qwen1.5-MoE-A2.7B LoRA, Qwen2-VL-7B video, Flan-T5-base eager, Qwen2.5-0.5B packed eager,
    # Qwen2.5-VL-7B SGD under expandable segments: reserved
    assert {k.margin.source: (round(k.worst[0], 2), k.worst[2]) for k in checks} == {
        "specs/gpus.yaml device.margin_pct": (-1.59, "reserved"),
        "specs/gpus.yaml device.margin_pct.checkpointed": (-3.44, "reserved"),
        "specs/gpus.yaml device.margin_pct.checkpointed_eager": (-0.28, "reserved"),
        "specs/gpus.yaml device.margin_pct.packed": (-13.31, "reserved"),
        "specs/gpus.yaml device.margin_pct.expandable_segments": (-1.81, "reserved"),
    }
    # each margin no wider than it needs: its worst record within one percentage point of it
    assert all(k.margin.percent + Fraction(str(k.worst[0])) < 1 for k in checks)
    # the same check is what `memspec validate` prints and gives in its JSON
    text = render(comparisons)
    assert "  packed                 margin 14 %  n=2    worst -13.31% (qwen2-packing_2.5-0.5b_b4_s2048_eager_gc-on, reserved)" in text
    data = as_data(comparisons)["margins"]
    assert [(m["source"].rsplit(".", 1)[-1], m["percent"], m["covered"]) for m in data] == [
        ("margin_pct", 2.0, True),
        ("packed", 14.0, True),
        ("checkpointed", 4.0, True),
        ("checkpointed_eager", 1.0, True),
        ("expandable_segments", 2.0, True),
    ]
