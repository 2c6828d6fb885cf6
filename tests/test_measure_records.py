"""Committed measured records are valid and self-consistent; the matrix expands as documented.

Needs neither torch nor transformers.
"""

from pathlib import Path

import pytest

from compiler.measure import record
from compiler.measure.experiment import ExperimentError, expand_matrix, grad_flows

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "tests" / "measured"
RECORDS = sorted([*(MEASURED / "cpu-trace").glob("*.json"), *(MEASURED / "tiny" / "expected").glob("*.json")])
MATRIX = ROOT / "specs" / "matrices" / "llava-1.5.yaml"


def test_there_are_records():
    assert RECORDS


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_record_is_valid_and_consistent(path):
    rec = record.read_record(path)
    assert record.validate(rec) == []
    assert rec["name"] == path.stem
    if "devices" in rec:
        # device_map: the figures are the largest GPU's; the steps are all GPUs together
        assert rec["allocated_first_step"] == max(d["allocated_first_step"] for d in rec["devices"])
        assert rec["allocated"] == max(d["allocated"] for d in rec["devices"])
        assert sum(d["allocated"] for d in rec["devices"]) >= max(s["allocated"] for s in rec["steps"][1:])
    else:
        assert rec["allocated_first_step"] == rec["steps"][0]["allocated"]
        assert rec["allocated"] == max(s["allocated"] for s in rec["steps"][1:])
    for step in rec["steps"]:
        assert sum(step["breakdown"].values()) == step["allocated"]
        assert step["phases"][step["phase"]]["allocated"] == step["allocated"]
    assert (ROOT / rec["experiment"]["model"]).is_file()


@pytest.mark.parametrize("path", sorted((MEASURED / "gpu").glob("*.json")), ids=lambda p: p.stem)
def test_gpu_record_is_valid(path):
    """The GPU's records too (18 measured with --alloc-conf once carried a key the schema lacked)."""
    rec = record.read_record(path)
    assert record.validate(rec) == []
    assert rec["source"] == "gpu"


def test_schema_rejects_a_float_byte_count():
    rec = record.read_record(RECORDS[0])
    rec["allocated"] = 1.5
    assert record.validate(rec) == ["$.allocated: 1.5 is not of type 'integer'"]


def test_matrix_expands_to_every_combination():
    entries = expand_matrix(MATRIX)
    names = [name for name, _ in entries]
    assert len(names) == len(set(names)) == 2 * 3 * 3 * 2 * 2 * 2  # models trainable b s attention gc
    exp = dict(entries)["llava-1.5_7b_proj-lang_b16_s2048_sdpa_gc-on"]
    assert exp["gradient_checkpointing"] == ["language"]  # the frozen tower is not checkpointed
    assert exp["trainable"] == ["projector", "language"]
    assert (exp["micro_batch"], exp["seq_len"], exp["precision"]) == (16, 2048, "bf16-mixed")
    full = dict(entries)["llava-1.5_13b_full_b1_s1024_eager_gc-on"]
    assert full["gradient_checkpointing"] == ["language", "vision"]


def test_gradients_flow_from_the_first_trainable_module_on():
    assert grad_flows(["projector"]) == ["projector", "language"]
    assert grad_flows(["vision", "language"]) == ["vision", "qformer", "projector", "language"]  # qformer: BLIP-2
    assert grad_flows([]) == []


def test_unknown_modules_are_refused(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text(MATRIX.read_text().replace("proj: [projector]", "proj: [projektor]").replace("../llava/", str(ROOT / "specs" / "llava") + "/"))
    with pytest.raises(ExperimentError, match="unknown module"):
        expand_matrix(bad)


def test_defaults_follow_the_models_modules(tmp_path):
    """As the estimator: every module of the spec trains by default, and a model without a
    vision tower gets no images (a text-only experiment once failed with KeyError 'projector')."""
    from compiler.measure.experiment import load_experiment

    exp = tmp_path / "t.yaml"
    exp.write_text(f"experiment: t\nmodel: {ROOT / 'specs' / 'qwen2' / 'qwen2.5-0.5b.yaml'}\nmicro_batch: 1\nseq_len: 64\n")
    loaded = load_experiment(exp)
    assert (loaded["trainable"], loaded["images_per_sample"]) == (["language"], 0)
    llava = tmp_path / "l.yaml"
    llava.write_text(f"experiment: l\nmodel: {ROOT / 'specs' / 'llava' / 'llava-1.5-7b.yaml'}\nmicro_batch: 1\nseq_len: 64\n")
    loaded = load_experiment(llava)
    assert (loaded["trainable"], loaded["images_per_sample"]) == (["vision", "projector", "language"], 1)


def test_a_module_the_model_lacks_is_refused(tmp_path):
    from compiler.measure.experiment import load_experiment

    exp = tmp_path / "t.yaml"
    exp.write_text(f"experiment: t\nmodel: {ROOT / 'specs' / 'qwen2' / 'qwen2.5-0.5b.yaml'}\nmicro_batch: 1\nseq_len: 64\ntrainable: [projector, language]\n")
    with pytest.raises(ExperimentError, match=r"has no module\(s\) \['projector'\]; it has \['language'\]"):
        load_experiment(exp)


def test_a_record_named_for_checkpointing_ran_it():
    """A matrix's `gc-on` / `gc-off` label says whether its entry checkpoints: a record whose
    name carries one has gradient_checkpointing set or empty accordingly. Four cpu-trace and
    two GPU DoRA records named gc-on once ran without checkpointing (an experiment made before
    expand_matrix kept checkpointing for LoRA-only modules, copied when they were measured
    again), and each estimated its own configuration, so nothing else showed it."""
    import json
    import re

    named = 0
    for path in sorted([*(MEASURED / "cpu-trace").glob("*.json"), *(MEASURED / "gpu").glob("*.json")]):
        rec = json.loads(path.read_text())
        label = re.search(r"(?:^|_)gc-(on|off)(?:_|$)", rec["name"])
        if label:
            named += 1
            assert bool(rec["experiment"]["gradient_checkpointing"]) == (label.group(1) == "on"), path.name
    assert named > 1000


def test_a_records_experiment_is_compared_with_its_entry_at_the_defaults():
    """`changed_keys` (what `memspec measure --matrix` checks a present record by): a key the
    record leaves out counts at its default (a LoRA block without use_dora, no `loss`), a key
    with no known default that an older record lacks is not compared (precision_mode), a
    device run's `gpu` is not the experiment; a changed value is named with both sides."""
    from compiler.measure.experiment import changed_keys

    entry = {
        "experiment": "m_b1",
        "model": "specs/qwen2/qwen2.5-0.5b.yaml",
        "micro_batch": 1,
        "gradient_checkpointing": ["language"],
        "lora": {"r": 16, "alpha": 32, "use_dora": False},
        "loss": "cross_entropy",
        "precision_mode": "master-weights",
    }
    older = {k: v for k, v in entry.items() if k not in ("loss", "precision_mode")} | {"lora": {"r": 16, "alpha": 32}, "gpu": "h200-141gb"}
    assert changed_keys(older, entry) == []
    assert changed_keys({**older, "gradient_checkpointing": []}, entry) == [("gradient_checkpointing", [], ["language"])]
    assert changed_keys({**entry, "lora": {"r": 16, "alpha": 32, "use_dora": True}}, entry) == [
        ("lora", {"r": 16, "alpha": 32, "use_dora": True}, {"r": 16, "alpha": 32, "use_dora": False})
    ]
