"""The order of the step's backward: autograd's, not the reverse of the spec's modules.

Every multimodal forward (transformers 5.23, *Model.forward of llava, llava_next, qwen2_vl,
qwen2_5_vl, paligemma, idefics3, smolvlm, internvl, gemma3) embeds the tokens first, then
runs the vision tower and projector, then scatters the image features in. Autograd runs the
backward in the reverse of creation (torch/csrc/autograd/engine.cpp: the ready queue pops the
node with the highest sequence_nr first), so a trained tower's backward runs before the token
embeddings'. The simulator walks the order `expand.forward_order` derives from the layer
table; the traced records say what the real step holds at that moment: each step's phase
peaks, and (`modules`) the highest point while the token embeddings' own ops ran.
"""

import functools
import json
from pathlib import Path

import pytest

from compiler.api import estimate
from compiler.pipeline.expand import forward_order
from compiler.commands.validation import record_report

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "measured" / "cpu-trace"
PALIGEMMA = ROOT / "specs" / "paligemma" / "paligemma-3b-pt-224.yaml"
QWEN2 = ROOT / "specs" / "qwen2" / "qwen2.5-0.5b.yaml"

# Records of a multimodal model whose vision tower trains: the order decides their backward.
TRAINED_TOWER = sorted(
    p.name for p in TRACES.glob("*.json") if (e := json.loads(p.read_text())["experiment"]).get("images_per_sample") and "vision" in e.get("trainable", ())
)
# Pure bf16 or fp32 SGD: no optimizer step above the backward, which is the step's peak
# (Qwen3-VL-2B's qwen3-vl.yaml and qwen3-vl-eager.yaml records are all SGD)
SGD = sorted(
    p.name
    for p in TRACES.glob("*.json")
    if p.name.startswith(("paligemma-sgd_", "idefics3-sgd_", "llava-1.5-sgd_", "qwen2-vl-sgd_", "qwen3-vl_2b_", "gemma3-sgd_"))
)
# What the phase comparison allows above a trace: the gate's MAPE, 0.5 %
OVER = 0.005


@functools.cache
def _load(name: str):
    """The record and its estimate, once per record (two tests read most of them); the
    allocator's replay is left out: these tests read the step's timeline and allocated peak."""
    path = TRACES / name
    record = json.loads(path.read_text())
    report, reason = record_report(path, record, replayed=False)
    assert report is not None, reason
    return record, report


def _steady(record: dict) -> dict:
    """The record's steady-state step (the highest after the first)."""
    return max(record["steps"][1:], key=lambda s: s["allocated"])


def _backward_high(report) -> int:
    """The estimate's highest point in the backward (the loss's backward included, as the
    trace's backward phase is all of loss.backward())."""
    return max(total for phase, _, total in report.estimate.timeline if phase == "backward")


def _embed_path(report) -> str:
    """The token embeddings' row: the embedding the module holding the image merge runs first."""
    lang = next(n for n in report.nodes if any(c.inst.formula.layer_type == "image_merge" for c in n.children))
    return next(c.inst.path for c in lang.children if c.inst.formula.layer_type == "embedding")


def test_forward_order_splits_the_language_model_at_the_image_merge():
    report = estimate(PALIGEMMA, micro_batch=1, seq_len=512, images_per_sample=1)
    roots = tuple(n.inst for n in report.nodes)
    assert [r.module for r in roots] == ["vision", "projector", "language"]
    names = [c.path.rsplit(".", 1)[-1] for c in roots[2].children]
    k = names.index("image_merge[0]")
    assert names[:k] == ["rotary_emb", "embed_tokens"]
    # language up to the merge, the tower, the projector, then the merge and the rest
    assert forward_order(roots) == ((2, 0, k), (0, 0, len(roots[0].children)), (1, 0, 0), (2, k, len(names)))


def test_text_only_model_runs_in_spec_order():
    report = estimate(QWEN2, micro_batch=1, seq_len=512)
    roots = tuple(n.inst for n in report.nodes)
    assert forward_order(roots) == tuple((i, 0, len(r.children)) for i, r in enumerate(roots))


def test_timeline_runs_the_tower_backward_before_the_token_embeddings():
    report = estimate(PALIGEMMA, micro_batch=1, seq_len=512, images_per_sample=1)
    events = [(phase, path) for phase, path, _ in report.estimate.timeline]
    first_vision_fw = events.index(("forward", "vision.patch_embedding"))
    assert events.index(("forward", "language.embed_tokens")) < first_vision_fw
    assert events.index(("forward", "language.image_merge[0]")) > first_vision_fw
    embed_bw = events.index(("backward", "language.embed_tokens"))
    vision_bw = [i for i, (phase, path) in enumerate(events) if phase == "backward" and path.startswith("vision.")]
    assert vision_bw and max(vision_bw) < embed_bw
    # the merge's backward comes before the projector's, which comes before the tower's
    assert events.index(("backward", "language.image_merge[0]")) < events.index(("backward", "projector")) < min(vision_bw)


def test_the_records_cover_both_families():
    assert any(n.startswith("paligemma") for n in TRAINED_TOWER)
    assert any(n.startswith("idefics3") for n in TRAINED_TOWER)
    assert {n.split("_")[0] for n in SGD} == {"paligemma-sgd", "idefics3-sgd", "llava-1.5-sgd", "qwen2-vl-sgd", "qwen3-vl", "gemma3-sgd"}


def test_qwen25vl_sgd_peak_holds_the_windowed_blocks_rng_state():
    """Qwen2.5-VL-7B, everything training in pure bf16 with SGD, no checkpointing: the step's
    peak is the loss's backward, with every vision block's saved tensors alive. sdpa runs one
    kernel call per window (16 per windowed block at 448 x 448, 64 at 896 x 896), each saving
    a 512-byte philox seed and offset; charged once per block the estimate was 414,720 B
    (448) and 1,797,120 B (896) under these traces."""
    for size in ("448x448", "896x896"):
        record, report = _load(f"qwen2-vl-sgd_2.5-7b_all_b1_{size}_s2048_sdpa_gc-off.json")
        step = _steady(record)
        assert (step["phase"], step["module"]) == ("backward", "loss")
        assert (report.estimate.peak.phase, report.estimate.peak.path) == ("backward", "language.loss")
        # above only by the loss's saved labels and weight sum (16,896 + 512 B), which the trace
        # frees after nll_loss's backward, less the 2,048 B the trace counts for
        # argsort(window_index), a host tensor on a GPU: +15,360 B (448), +9,216 B (896)
        assert 0 <= report.tensors - record["allocated"] <= 17_408


# NB, a known gap: under autocast with the CLIP tower trained at micro-batch 4, the estimate's
# backward (at the loss, the phase's peak) is 9,559,552 B (0.007 %) under the trace; the step's
# peak (the optimizer) is exact. Not explained yet: about one fp32 [4, 577, 1024] tensor more is
# alive in the trace at that moment. Strict, so that a fix shows.
KNOWN_UNDER = {"autocast-llava_7b_full_b4_s1024_gc-off.json"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="autocast, tower trained, b 4: backward 9,559,552 B under the trace"))
        if n in KNOWN_UNDER
        else n
        for n in TRAINED_TOWER
    ],
)
def test_backward_phase_against_the_trace(name):
    """The estimate's backward never below the traced backward phase, at most 0.5 % above.
    Walking the modules in reverse spec order put PaliGemma's tied-embedding backward before
    the tower's gradients existed: 555 to 775 MiB under the trace (micro-batch 1). Qwen2.5-VL's
    windowed blocks call sdpa once per window, each call saving its own philox seed and offset:
    charged once per block, the loss's backward was 414,720 B under the trace."""
    record, report = _load(name)
    measured = _steady(record)["phases"]["backward"]["allocated"]
    high = _backward_high(report)
    assert measured <= high <= measured * (1 + OVER), (high - measured) / 2**20


@pytest.mark.parametrize("name", [n for n in TRAINED_TOWER if "modules" in _steady(json.loads((TRACES / n).read_text()))["phases"]["backward"]])
def test_token_embeddings_backward_against_the_trace(name):
    """The moment of the token embeddings' backward: after the tower's (its gradients there,
    its activations gone), whether or not it is the phase's peak (Idefics3's is the tower's
    first layer). In reverse spec order SmolVLM's estimate there was 213 MiB under the trace
    with checkpointing, LLaVA-1.5-7B's 1,115 MiB."""
    record, report = _load(name)
    ((module, measured),) = _steady(record)["phases"]["backward"]["modules"].items()
    assert module.endswith("embed_tokens")
    path = _embed_path(report)
    at = [total for phase, p, total in report.estimate.timeline if phase == "backward" and p == path]
    assert len(at) == 1
    assert measured <= at[0] <= measured * (1 + OVER), (at[0] - measured) / 2**20


@pytest.mark.parametrize("name", SGD)
def test_sgd_peak_is_the_backward(name):
    """No optimizer states and no step temporaries: the step's peak is in the backward, for the
    estimate as for the trace, and where the trace has it at the token embeddings (PaliGemma's
    tied table, LLaVA's), so does the estimate. In reverse spec order PaliGemma's peak was
    775 MiB (5.9 %) under the trace with checkpointing."""
    record, report = _load(name)
    step = _steady(record)
    assert step["phase"] == "backward"
    assert report.estimate.peak.phase == "backward"
    assert record["allocated"] <= report.tensors <= record["allocated"] * (1 + OVER)
    if step["module"].endswith("embed_tokens"):
        assert report.estimate.peak.path == _embed_path(report)
