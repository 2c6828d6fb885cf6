"""peft's own state against memspec's: for modules_to_save and bias, the model the measuring
side builds (peft 0.21's get_peft_model on the Hugging Face model, fake tensors) holds exactly
the parameters memspec counts, and exactly the trainable ones (requires_grad) memspec trains.

Models: the tiny LLaVA of tests/measured/tiny (CLIP and projector with biases, a Llama
without), Qwen2.5-0.5B (q/k/v biases, tied embeddings) from its checked-in config.
"""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="measuring needs torch")
pytest.importorskip("transformers", reason="measuring needs transformers")
pytest.importorskip("peft", reason="measuring needs peft")

from compiler.api import estimate  # noqa: E402
from compiler.measure.experiment import load_experiment, normalise_lora, with_overrides  # noqa: E402
from compiler.measure.harness import build_model, load_config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "measured" / "tiny" / "tiny-pretrain.yaml"


def _qwen_experiment(tmp_path):
    path = tmp_path / "qwen.yaml"
    path.write_text(
        f"experiment: q\nmodel: {ROOT / 'specs/qwen2/qwen2.5-0.5b.yaml'}\nmicro_batch: 1\nseq_len: 64\n"
        "images_per_sample: 0\ntrainable: []\nprecision: bf16-mixed\nattention: sdpa\nparallel: {dp: 1, zero: 0}\n"
    )
    return path


def _peft_counts(path, lora):
    from torch._subclasses.fake_tensor import FakeTensorMode

    exp = with_overrides(load_experiment(path), lora=normalise_lora(lora))
    with FakeTensorMode():
        model = build_model(load_config(exp["config"]), exp)
    # NB: a tied table is one Parameter object: counted once, as memspec counts it
    params = {id(p): p for p in model.parameters()}
    return sum(p.numel() for p in params.values()), sum(p.numel() for p in params.values() if p.requires_grad)


def _memspec_counts(path, lora):
    r = estimate(str(path), lora=lora)
    return sum(r.parameters.values()), r.estimate.trainable_params


@pytest.mark.parametrize(
    "lora",
    [
        {"r": 4, "target_modules": "all-linear", "modules": ["language"], "bias": "all"},
        {"r": 4, "target_modules": "all-linear", "modules": ["language"], "bias": "lora_only"},
        {"r": 4, "target_modules": "all-linear", "modules": ["language"], "modules_to_save": ["multi_modal_projector"]},
        {"r": 4, "target_modules": "all-linear", "modules": ["language"], "modules_to_save": ["lm_head", "embed_tokens"], "bias": "all"},
    ],
    ids=["bias-all", "bias-lora-only", "save-projector", "save-head-embed-bias-all"],
)
def test_tiny_llava_state_is_peft_state(lora):
    peft = _peft_counts(TINY, lora)
    assert _memspec_counts(TINY, lora) == peft


@pytest.mark.parametrize(
    "lora",
    [
        {"r": 8, "target_modules": "all-linear", "bias": "all"},
        {"r": 8, "target_modules": ["q_proj"], "bias": "lora_only"},
        {"r": 8, "target_modules": "all-linear", "modules_to_save": ["embed_tokens"]},
        {"r": 8, "target_modules": "all-linear", "modules_to_save": ["lm_head", "embed_tokens"]},
    ],
    ids=["bias-all", "q-bias-lora-only", "save-embed-tied", "save-head-embed-tied"],
)
def test_qwen2_state_is_peft_state(lora, tmp_path):
    path = _qwen_experiment(tmp_path)
    lora = {"alpha": 8, "modules": ["language"], **lora}
    assert _memspec_counts(path, lora) == _peft_counts(path, lora)
