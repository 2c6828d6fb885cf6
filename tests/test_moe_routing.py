"""Mixture-of-experts memory does not depend on the routing (transformers' grouped_mm experts).

The formulas (formulas/grouped_experts.yaml) assume it; here a tiny Mixtral trains on real CPU
tensors with the router forced to an exactly balanced assignment and to the worst case (every
token to the same k experts), and the traced allocations are equal, step by step and phase by
phase, and equal to the model's own routing.
"""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="measuring needs torch")
pytest.importorskip("transformers", reason="measuring needs transformers")

from compiler.measure import experiment, harness  # noqa: E402
from compiler.measure.families import mixtral  # noqa: E402

# 4 experts, top 2; b 2 x s 32 = 64 tokens, 128 (token, expert) pairs: 32 per expert balanced,
# 64 for experts 0 and 1 (and none for 2 and 3) in the worst case
CONFIG = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_act": "silu",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "output_router_logits": False,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("mixtral")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "spec.yaml").write_text("model: tiny-mixtral\nsource: {config: config.json}\n")
    (folder / "exp.yaml").write_text(
        "experiment: tiny-mixtral\nmodel: spec.yaml\nmicro_batch: 2\nseq_len: 32\nimages_per_sample: 0\n"
        "trainable: [language]\nprecision: fp32\nattention: eager\n"
    )
    return experiment.load_experiment(Path(folder / "exp.yaml"))


def test_assignments_are_balanced_and_worst():
    balanced = mixtral.assignment(64, 2, 4, "balanced")
    worst = mixtral.assignment(64, 2, 4, "worst")
    assert torch.bincount(balanced.flatten(), minlength=4).tolist() == [32, 32, 32, 32]
    assert torch.bincount(worst.flatten(), minlength=4).tolist() == [64, 64, 0, 0]
    assert all(len(set(row)) == 2 for row in balanced.tolist() + worst.tolist())  # k distinct experts per token
    with pytest.raises(ValueError, match="expected one of balanced, worst"):
        mixtral.assignment(64, 2, 4, "skewed")


def test_the_default_experts_implementation_is_grouped_mm(tiny):
    config = mixtral.load_config(tiny["config"])
    model = mixtral.model_class()._from_config(config)
    assert model.config._experts_implementation == "grouped_mm"
    gate = model.model.layers[0].mlp.gate
    original = type(gate).forward
    with mixtral.routing("worst") as name:
        _, weights, indices = gate(torch.randn(5, 64, dtype=gate.weight.dtype))
    assert name == "moe-routing-worst"
    assert indices.tolist() == [[0, 1]] * 5
    assert torch.allclose(weights.sum(-1), torch.ones(5))  # renormalised, as top-k's were
    assert weights.requires_grad  # the router still gets its gradient
    assert type(gate).forward is original  # the patch is gone


def _phases(exp: dict) -> list[dict]:
    measured = harness.measure(exp, steps=2, fake=False, emulate=False, granularity=1)
    return [{phase: p["allocated"] for phase, p in step.phases.items()} for step in measured.steps]


def test_traced_memory_is_the_same_for_every_routing(tiny):
    own = _phases(tiny)
    with mixtral.routing("balanced"):
        balanced = _phases(tiny)
    with mixtral.routing("worst"):
        worst = _phases(tiny)
    assert len(own) == 2 and set(own[0]) == {"forward", "loss", "backward", "optimizer"}
    assert balanced == worst
    # the fixed assignment's gather allocates what topk did (values [tokens, k]) and its
    # indices come from arange instead of topk: the same bytes
    assert balanced == own


def test_the_eager_experts_loop_allocates_by_the_routing(tiny, monkeypatch):
    """transformers' other experts implementation, the per-expert loop (MixtralExperts.forward,
    experts_implementation="eager"), reads the routing on the host (`nonzero`, `torch.where`)
    and allocates per expert hit: the backward differs between routings, which is why the
    families refuse it (specs/families/mixtral.yaml, qwen3_moe.yaml: experts_impl)."""
    load = mixtral.load_config

    def eager(path):
        config = load(path)
        config._experts_implementation = "eager"
        return config

    monkeypatch.setattr(mixtral, "load_config", eager)
    with mixtral.routing("balanced"):
        balanced = _phases(tiny)
    with mixtral.routing("worst"):
        worst = _phases(tiny)
    for b, w in zip(balanced, worst):
        assert b["forward"] == w["forward"]  # the tiny sizes keep the forward's per-expert temporaries below its peak
        # every expert hit selects from the stacked weights (gate_up_proj[e], down_proj[e] with a
        # 0-dim index: SelectBackward0), whose backward materialises a zero gradient of the whole
        # stack per hit; balanced hits all 4 experts, worst 2
        assert b["backward"] > w["backward"]
    monkeypatch.undo()
    assert balanced != _phases(tiny)  # and grouped_mm is a third answer


def test_the_families_refuse_the_eager_experts_loop(tmp_path):
    from compiler.inputs import importer
    from compiler.errors import MemspecError

    fixture = Path(__file__).parent / "fixtures" / "hub" / "Mixtral-8x7B-v0.1"
    for f in fixture.iterdir():
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "config.json").unlink()
    config = json.loads((fixture / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "experts_implementation": "eager"}))
    with pytest.raises(MemspecError, match="experts_impl == 'grouped_mm' is false"):
        importer.import_spec(str(tmp_path))
    assert importer.import_spec(str(fixture)).data["model"] == "Mixtral-8x7B-v0.1"
