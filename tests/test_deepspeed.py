"""DeepSpeed's buffers, pinned to the allocation sizes in DeepSpeed's and transformers' source
(no DeepSpeed run is possible on fake tensors): the ZeRO-1/2 reduce buckets
(stage_1_and_2.py backward(): ipg_buffer, doubled with overlap_comm), ZeRO-3's single bucket
and its prefetch, and HF Trainer's "auto" sizes (integrations/deepspeed.py: hidden_size^2 and
0.9 hidden_size^2). LLaVA-1.5-7B: hidden_size 4096 (text_config)."""

from dataclasses import replace

import pytest

from compiler.api import estimate, load_inputs, run

H = 4096
BF16 = 2


def _buckets(report) -> int:
    return report.estimate.peak.breakdown.get("deepspeed", {}).get("gradients", 0)


def test_zero2_auto_overlap_is_two_hidden_squared_buckets():
    r = estimate("specs/experiments/llava-1.5-7b-seed-s2048-b8-dp8.yaml")
    assert r.setup.deepspeed.reduce_bucket == H * H  # "auto" = 16_777_216 elements
    assert _buckets(r) == 2 * H * H * BF16  # 2 x 32 MiB = 67_108_864


def test_zero2_without_overlap_has_one_bucket():
    spec, setup = load_inputs("specs/experiments/llava-1.5-7b-seed-s2048-b8-dp8.yaml")
    one = run(spec, replace(setup, deepspeed=replace(setup.deepspeed, overlap_comm=False)))
    assert _buckets(one) == H * H * BF16


def test_zero3_has_one_bucket_and_prefetches():
    spec, setup = load_inputs("specs/experiments/llava-1.5-7b-finetune.yaml")
    r = run(spec, setup)
    assert _buckets(r) == H * H * BF16
    assert setup.deepspeed.prefetch_bucket == int(0.9 * H * H)  # 15_099_494 elements
    without = run(spec, replace(setup, deepspeed=replace(setup.deepspeed, prefetch_bucket=0)))
    # the prefetched weights sit on top of the running layer: 15_099_494 * 2 = 30_198_988 B,
    # rounded up to the allocator's 512 B
    assert r.tensors - without.tensors == 30_199_296


def test_deepspeed_defaults_when_the_config_says_nothing():
    r = estimate("specs/llava/llava-1.5-7b.yaml", micro_batch=1, seq_len=1024, zero=2, dp=8)
    ds = r.setup.deepspeed
    assert (ds.reduce_bucket, ds.overlap_comm, ds.contiguous_gradients) == (500_000_000, False, True)
    assert _buckets(r) == 1_000_000_000  # one bucket of 5e8 bf16 elements


def test_no_deepspeed_buffers_without_zero():
    r = estimate("specs/llava/llava-1.5-7b.yaml", micro_batch=1, seq_len=1024)
    assert r.setup.deepspeed is None and _buckets(r) == 0


def test_auto_needs_the_hidden_size(tmp_path, monkeypatch):
    from compiler.errors import MemspecError

    spec = open("specs/llava/llava-1.5-7b.yaml").read().replace("hidden_size: 4096", "")
    (tmp_path / "spec.yaml").write_text(spec.replace("config: hf/llava-1.5-7b/config.json", "config: config.json"))
    (tmp_path / "exp.yaml").write_text("experiment: x\nmodel: spec.yaml\nmicro_batch: 1\nseq_len: 1024\nparallel: {dp: 8, zero: 2, reduce_bucket_size: auto}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MemspecError) as err:
        estimate("exp.yaml")
    assert "E505" in err.value.render() and "hidden_size" in err.value.render()
