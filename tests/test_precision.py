"""Precision named as Lightning names it, realized as the run does: bf16-mixed is torch.autocast
on fp32 weights unless DeepSpeed is stated (16-bit weights, fp32 masters), bf16-true pure bf16,
32-true fp32; HF Trainer flags and accelerate configs map onto them."""

import json
from pathlib import Path

import pytest

from compiler.api import estimate
from compiler.cli import main
from compiler.errors import MemspecError

ROOT = Path(__file__).resolve().parent.parent
LLAMA = str(ROOT / "specs" / "llama" / "llama-2-7b.yaml")
P = 6_738_415_616  # Llama-2-7B's parameters
CUBLAS = 2 * (32 * 2**20 + 2**20)  # two GEMM threads' cuBLAS + cuBLASLt workspaces (sm90)
BATCH = 2 * 1024 * 8 + 2 * 512  # input_ids and labels [1, 1024] int64, inv_freq and original_inv_freq (512-B blocks)


def _llama(**kw):
    return estimate(LLAMA, micro_batch=1, seq_len=1024, images_per_sample=0, attention="sdpa", **kw)


def test_bf16_mixed_stated_without_deepspeed_is_autocast_with_fp32_model_states():
    r = _llama(precision="bf16-mixed")
    assert r.setup.mode == "autocast"
    assert (r.setup.bytes["param"], r.setup.bytes["grad"], r.setup.bytes["optim"], r.setup.bytes["act"]) == (4, 4, 8, 2)
    # the foreach AdamW step is the peak: fp32 weights 4P + gradients 4P + exp_avg, exp_avg_sq 8P
    # + the sqrt copy of exp_avg_sq 4P = 20P; the traced record
    # (autocast-llama_llama-2-7b_full_b1_s1024_gc-off) measured the same 134_837_535_744 B
    assert r.allocated == 20 * P + CUBLAS + BATCH == 134_837_535_744
    assert r.allocated == _llama(precision="32-true").allocated  # autocast's model states are fp32's


def test_a_zero_stage_makes_it_deepspeeds_master_weights():
    r = _llama(precision="bf16-mixed", zero=0)
    assert r.setup.mode == "master-weights"
    # bf16 weights 2P + bf16 gradients 2P + masters and states 12P + the fp32 gradients 4P + the
    # sqrt copy 4P = 24P: 4P (26.95 GB) more than autocast
    assert r.allocated == 24 * P + CUBLAS + BATCH == 161_791_198_208
    assert _llama(precision="bf16-mixed", precision_mode="master-weights").allocated == r.allocated


def test_an_unstated_precision_keeps_master_weights():
    r = estimate(LLAMA, micro_batch=1, seq_len=1024, images_per_sample=0, attention="sdpa")
    assert (r.setup.precision, r.setup.mode) == ("bf16-mixed", "master-weights")


@pytest.mark.parametrize(
    "name, key, mode",
    [
        ("bf16-true", "bf16", "pure"),
        ("bf16", "bf16", "pure"),
        ("16-true", "fp16", "pure"),
        ("32-true", "fp32", "fp32"),
        ("32", "fp32", "fp32"),
        ("16-mixed", "fp16-mixed", "autocast"),
    ],
)
def test_lightning_names(name, key, mode):
    r = _llama(precision=name)
    assert (r.setup.precision, r.setup.mode) == (key, mode)


def test_the_setup_line_and_json_say_how_it_runs(capsys):
    assert main(["estimate", LLAMA, "--micro-batch", "1", "--seq-len", "1024", "--precision", "bf16-mixed", "--format", "json"]) == 0
    setup = json.loads(capsys.readouterr().out)["setup"]
    assert (setup["precision"], setup["precision_mode"]) == ("bf16-mixed", "autocast")
    assert setup["precision_realization"].startswith("fp32 weights, gradients and optimizer states, forward under torch.autocast")
    assert main(["estimate", LLAMA, "--micro-batch", "1", "--seq-len", "1024", "--precision", "bf16-mixed", "--zero", "0"]) == 0
    assert "| bf16-mixed (16-bit weights, fp32 master weights) |" in capsys.readouterr().out


def _script(tmp_path, text):
    path = tmp_path / "train.sh"
    path.write_text(text)
    return str(path)


def test_hf_trainer_bf16_is_autocast_without_deepspeed_and_masters_with_it(tmp_path):
    from compiler.cli import parser
    from compiler.cli import _report

    base = "torchrun --nproc_per_node 1 train.py --per_device_train_batch_size 1 --model_max_length 1024 --bf16 True{}\n"
    plain = _report(parser().parse_args(["estimate", LLAMA, "--from-command", _script(tmp_path, base.format(""))]))
    # NB: a launch script steps the Trainer's two parameter groups, so its sqrt copy is the larger
    # group's only: under 20P
    assert plain.setup.mode == "autocast" and plain.setup.bytes["param"] == 4 and plain.allocated < 20 * P + CUBLAS + BATCH
    zero2 = ROOT / "tests" / "fixtures" / "launch" / "scripts" / "zero2.json"
    ds = _report(parser().parse_args(["estimate", LLAMA, "--from-command", _script(tmp_path, base.format(f" --deepspeed {zero2}"))]))
    assert ds.setup.mode == "master-weights" and ds.setup.zero == 2


def test_gated_families_and_settings_are_refused():
    with pytest.raises(MemspecError) as err:
        estimate(str(ROOT / "specs" / "gemma" / "gemma-2b.yaml"), micro_batch=1, seq_len=512, images_per_sample=0, precision="bf16-mixed")
    assert "E325" in err.value.render() and "formulas/gemma_causal_lm.yaml does not list autocast" in err.value.render()
    with pytest.raises(MemspecError) as err:
        _llama(precision="bf16-mixed", lora={"r": 16})
    assert "E325" in err.value.render()
