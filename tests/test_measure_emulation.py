"""Each CUDA behaviour the traced step emulates, pinned on tiny tensors and a tiny LLaVA."""

from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="measuring needs torch")
pytest.importorskip("transformers", reason="measuring needs transformers")

import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from compiler.measure import emulation, experiment, harness  # noqa: E402
from compiler.measure.tracer import MemoryTracer, round_up  # noqa: E402

TINY = Path(__file__).parent / "measured" / "tiny"
BLOCK = 512
B, HEADS, S, D = 2, 4, 256, 64  # s^2 = 65_536 elements per head: easy to spot


def _tiny(**overrides) -> dict:
    return experiment.with_overrides(experiment.load_experiment(TINY / "tiny-finetune.yaml"), **overrides)


def _new_storages(fn, *shapes, dtype=torch.bfloat16, skip=frozenset()):
    """Storages `fn` leaves alive (outputs and what autograd saved), as (op, dtype, shape, bytes)."""
    with FakeTensorMode(), emulation.cuda_behaviour(fake=True, skip=skip):
        inputs = [torch.empty(shape, dtype=dtype, requires_grad=True) for shape in shapes]
        with MemoryTracer() as tracer:
            tracer.register(inputs, "inputs")
            out = fn(*inputs)  # noqa: F841 - keeps the graph (and its saved tensors) alive
            return [(r.op, r.dtype, r.shape, r.nbytes) for r in tracer.live.values() if r.category != "inputs"]


def _attention(q, k, v):
    # q, k, v as transformers passes them: [b, heads, s, d] views of [b, s, heads, d]
    q, k, v = (t.view(B, S, HEADS, D).transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_sdpa_runs_cudas_flash_kernel_and_saves_only_its_set():
    live = _new_storages(_attention, *[(B, S, HEADS * D)] * 3)
    # out [b, h, s, d] bf16 (2 * 2*4*256*64 = 262_144 B) + logsumexp fp32 [b, h, s]
    # (4 * 2*4*256 = 8_192 B) + rng state uint64[2] and an unused uint64[] (512 B each)
    assert sorted(n for *_, n in live) == [BLOCK, BLOCK, 4 * B * HEADS * S, 2 * B * HEADS * S * D]
    assert {op for op, *_ in live} == {"_scaled_dot_product_flash_attention.default"}
    assert not [shape for _, _, shape, _ in live if tuple(shape[-2:]) == (S, S)]


def test_without_the_patch_the_cpu_kernel_runs():
    live = _new_storages(_attention, *[(B, S, HEADS * D)] * 3, skip=frozenset({emulation.FLASH_ATTENTION}))
    assert {op for op, *_ in live} == {"_scaled_dot_product_flash_attention_for_cpu.default"}


def test_fp32_attention_takes_the_memory_efficient_kernel():
    live = _new_storages(_attention, *[(B, S, HEADS * D)] * 3, dtype=torch.float32)
    assert {op for op, *_ in live} == {"_scaled_dot_product_efficient_attention.default"}
    # logsumexp padded to a multiple of 32 positions: 4 * 2*4*256 B
    assert 4 * B * HEADS * S in [n for *_, n in live]


def test_dropout_saves_a_bool_mask():
    n = 1000
    live = _new_storages(lambda x: F.dropout(x, p=0.1, training=True), (n,))
    # output bf16 (2_000 B -> 2_048) + CUDA's bool mask (1_000 B -> 1_024)
    assert sorted((dtype, nbytes) for _, dtype, _, nbytes in live) == [("bfloat16", 2048), ("bool", 1024)]
    cpu = _new_storages(lambda x: F.dropout(x, p=0.1, training=True), (n,), skip=frozenset({emulation.NATIVE_DROPOUT}))
    assert "bool" not in {dtype for _, dtype, _, _ in cpu}  # the CPU path saves a bf16 noise tensor


class _Order:
    """An allocator stand-in that records the tracer's allocations and frees in order."""

    def __init__(self):
        self.events: list[tuple[str, int]] = []
        self.sizes: dict = {}

    def malloc(self, key, nbytes):
        self.sizes[key] = nbytes
        self.events.append(("+", nbytes))

    def free(self, key):
        self.events.append(("-", self.sizes.pop(key)))

    def __contains__(self, key):
        return key in self.sizes


def _allocation_order(fn, *inputs_of):
    """The sizes the tracer hands its allocator while `fn` runs on inputs made by `inputs_of`."""
    with FakeTensorMode(), emulation.cuda_behaviour(fake=True):
        inputs = [make() for make in inputs_of]
        order = _Order()
        with MemoryTracer(scratch=emulation.kernel_scratch, made_order=emulation.made_order, allocator=order):
            out = fn(*inputs)  # noqa: F841 - keeps the outputs alive
    return order.events


def test_dropout_makes_its_mask_before_its_output():
    # Dropout.cu dropout_cuda: empty_like(self, bool), then empty_like(self); native_dropout
    # returns (output, mask). 1000 bf16 elements: the 1,000 B mask, then the 2,000 B output
    events = _allocation_order(lambda x: F.dropout(x, p=0.1, training=True), lambda: torch.empty(1000, dtype=torch.bfloat16))
    assert events[:2] == [("+", 1000), ("+", 2000)]


def test_masked_scatter_holds_its_prefix_sum_and_the_contiguous_mask():
    # LLaVA's merge: inputs_embeds.masked_scatter(mask [b, s, 1] expanded to [b, s, dim], features).
    # The clone [2, 8, 16] bf16 (512 B), the int64 prefix sum over it (256 * 8 = 2,048 B), the
    # expanded mask made contiguous (256 B), both freed as the op returns
    def merge(embeds, mask, features):
        return embeds.masked_scatter(mask.unsqueeze(-1).expand_as(embeds), features)

    events = _allocation_order(
        merge,
        lambda: torch.empty(2, 8, 16, dtype=torch.bfloat16),
        lambda: torch.zeros(2, 8, dtype=torch.bool),
        lambda: torch.empty(4, 16, dtype=torch.bfloat16),
    )
    clone = events.index(("+", 512))
    assert events[clone : clone + 5] == [("+", 512), ("+", 2048), ("+", 256), ("-", 2048), ("-", 256)]


def _forward_ops(measured: harness.Measurement, step: int = 2) -> Counter:
    return Counter(
        (row["op"], row["module"].split(".")[1] if "." in row["module"] else row["module"])
        for row in measured.timeline
        if row["step"] == step and row["phase"] == "forward"
    )


def test_vision_tower_and_language_model_both_take_flash():
    measured = harness.measure(_tiny(), steps=2, timeline=True)
    ops = _forward_ops(measured)
    # 3 CLIP layers, 2 Llama layers (checkpointed: their recomputation is in backward)
    assert ops[("_scaled_dot_product_flash_attention.default", "vision_tower")] == 3
    assert ops[("_scaled_dot_product_flash_attention.default", "language_model")] == 2
    assert not [op for op, _ in ops if "efficient" in op or "softmax" in op and op != "_log_softmax.default"]


def test_no_causal_mask_is_materialised_under_checkpointing():
    patched = harness.measure(_tiny(), steps=2, timeline=True)
    masked = ("efficient_attention", "cudnn_attention")
    assert not [op for op, _ in _forward_ops(patched) if any(k in op for k in masked)]
    unpatched = harness.measure(_tiny(), steps=2, timeline=True, skip=frozenset({emulation.NO_PACKED_SEQUENCE_MASK}))
    # transformers sees fake position ids as tracing, builds a [b, 1, s, s] mask and SDPA
    # can then not use flash (cuDNN attention on sm90 takes the mask)
    assert [op for op, _ in _forward_ops(unpatched) if "cudnn_attention" in op]
    assert "bool[2x1x48x48]" in unpatched.inventory  # kept for the recomputation
    assert "bool[2x1x48x48]" not in patched.inventory


def _activations_at_end_of_forward(measured: harness.Measurement) -> int:
    return int(measured.inventory.splitlines()[2].split()[0])


def test_eager_attention_keeps_the_s_squared_probabilities():
    b, s, heads, layers = 2, 48, 4, 2  # tiny-finetune, checkpointing off
    sdpa = harness.measure(_tiny(gradient_checkpointing=[]), steps=2)
    eager = harness.measure(_tiny(gradient_checkpointing=[], attention="eager"), steps=2)
    # Per layer eager saves fp32 softmax + bf16 probabilities (4 + 2 bytes per b*h*s^2) and
    # copies of q, k, v and the output (the same bytes as flash's q, k, v, out); flash
    # instead saves an fp32 logsumexp and two 512-byte rng tensors.
    per_layer = 6 * b * heads * s * s - round_up(4 * b * heads * s, BLOCK) - 2 * BLOCK
    assert per_layer == 108_032
    assert _activations_at_end_of_forward(eager) - _activations_at_end_of_forward(sdpa) == layers * per_layer


def _masked_attention(q, k, v):
    # Phi-3's layout: the rotary's torch.cat makes q, k contiguous [b, heads, s, d]; a bool mask
    q, k = (t.view(B, HEADS, S, D) for t in (q, k))
    v = v.view(B, S, HEADS, D).transpose(1, 2)
    mask = torch.ones(B, 1, S, S, dtype=torch.bool)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).contiguous()


def test_masked_16_bit_attention_runs_cudnn_and_its_output_is_laid_out_like_q():
    """sm90 prefers cuDNN attention (emulation.CUDNN_MAX_HEAD_DIM): it saves the additive mask
    (2 * 2*1*256*256 = 262_144 B), its output, laid out like the contiguous q, so the transpose
    before o_proj copies it (2 x 2 * 2*4*256*64 = 262_144 B), fp32 stats [b, h, s, 1]
    (4 * 2*4*256 = 8_192 B, not padded) and an 8 B philox seed and offset (512 B blocks)."""
    live = _new_storages(_masked_attention, *[(B * S, HEADS * D)] * 3)
    assert {op for op, *_ in live} >= {"_scaled_dot_product_cudnn_attention.default", "clone.default"}
    out = 2 * B * HEADS * S * D
    assert sorted(n for *_, n in live) == sorted([BLOCK, BLOCK, 4 * B * HEADS * S, out, out, 2 * B * S * S])
    fp32 = _new_storages(_masked_attention, *[(B * S, HEADS * D)] * 3, dtype=torch.float32)
    assert "_scaled_dot_product_efficient_attention.default" in {op for op, *_ in fp32}


def test_cudnn_attention_backward_holds_its_workspace():
    """The backward's workspace: 4 b h s d + 4 b h s + 256 = 4*2*4*256*64 + 4*2*4*256 + 256
    = 532_736 B (an H200's history for Phi-3-mini at s 2048, d 96: 25,428,224 B)."""
    with FakeTensorMode(), emulation.cuda_behaviour(fake=True):
        q, k, v = (torch.empty(B * S, HEADS * D, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        with MemoryTracer(scratch=emulation.kernel_scratch) as tracer:
            _masked_attention(q, k, v).float().sum().backward()
    scratch = {name: n for p in tracer.peaks.values() for name, n in p.scratch}
    assert scratch[emulation.CUDNN_BACKWARD_SCRATCH] == 4 * B * HEADS * S * D + 4 * B * HEADS * S + 256 == 532_736
    assert (
        emulation._cudnn_backward_scratch(
            torch.empty(1, 32, 2048, 96, device="meta"), torch.empty(1, 32, 2048, 96, device="meta"), torch.empty(1, 32, 2048, 96, device="meta")
        )
        == 25_428_224
    )


def test_softmax_backward_holds_cudas_grad_times_output():
    """SoftMax.cu softmax_backward_cuda_out allocates `tmp = grad * output` beside grad_input:
    eager attention's softmax(dtype=float32) of bf16 scores, [2, 4, 256, 256], gives an fp32
    gradient and output, so the scratch is 2 * 4 * 256 * 256 * 4 = 2_097_152 B."""
    with FakeTensorMode(), emulation.cuda_behaviour(fake=True):
        scores = torch.empty(B, HEADS, S, S, dtype=torch.bfloat16, requires_grad=True)
        with MemoryTracer(scratch=emulation.kernel_scratch) as tracer:
            F.softmax(scores, dim=-1, dtype=torch.float32).to(torch.bfloat16).sum().backward()
    peak = tracer.peaks[(tracer.step, tracer.phase)]  # the saved output, the gradient, grad_input and tmp
    assert peak.op == "_softmax_backward_data.default"
    assert dict(peak.scratch)[emulation.SOFTMAX_BACKWARD_SCRATCH] == 2 * 4 * 256 * 256 * 4 == 2_097_152


def _trainable_fp32_bytes(exp: dict) -> int:
    config = harness.load_config(exp["config"])
    with torch.device("meta"):
        model = harness.build_model(config, exp)
    return sum(round_up(4 * p.numel(), BLOCK) for p in model.parameters() if p.requires_grad)


def test_foreach_adamw_holds_a_copy_of_the_second_moments():
    exp = _tiny()
    measured = harness.measure(exp, steps=2, timeline=True)
    fp32 = _trainable_fp32_bytes(exp)
    peak = measured.steps[1]
    assert (peak.phase, peak.op) == ("optimizer", "_foreach_sqrt.default")
    # masters + exp_avg + exp_avg_sq, fp32: 12 bytes per trainable parameter, and no
    # per-parameter `step` counters (host tensors on CUDA)
    assert peak.breakdown["optimizer_states"] == 3 * fp32
    # torch._foreach_sqrt(exp_avg_sqs) is the temporary; fp32 gradients are alive too
    assert peak.breakdown["optimizer_temporaries"] == fp32
    assert peak.breakdown["master_gradients"] == fp32


@pytest.mark.parametrize("impl, expected_op", [("fused", "_fused_adamw_.default"), ("forloop", "sqrt.default")])
def test_other_adamw_implementations(impl, expected_op):
    exp = _tiny(optimizer={"type": "adamw", "impl": impl})
    measured = harness.measure(exp, steps=2, timeline=True)
    ops = {row["op"] for row in measured.timeline if row["phase"] == "optimizer"}
    assert expected_op in ops
    assert not {op for op in ops if op.startswith("_foreach_sqrt")}


def test_qwen2_5_vl_window_index_runs_on_the_host_with_the_models_values(monkeypatch):
    from torch._subclasses import fake_tensor
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
    from transformers.vision_utils import get_vision_window_index

    from compiler.measure.families import qwen2_5_vl

    # two images: 448 x 336 px and 224 x 224 px at patch 14 -> grids (1, 32, 24) and (1, 16, 16);
    # Qwen2.5-VL's window is 112 px = 4 x 4 merged tokens
    grid = torch.tensor([[1, 32, 24], [1, 16, 16]])
    want_index, want_cu = get_vision_window_index(grid, spatial_merge_size=2, window_size=112, patch_size=14)
    monkeypatch.setattr(fake_tensor, "CONSTANT_NUMEL_LIMIT", emulation.HOST_VALUE_NUMEL_LIMIT)  # as the harness runs it
    mode = FakeTensorMode()
    fake_grid = mode.fake_tensor_converter.from_real_tensor(mode, grid, make_constant=True)
    with mode, pytest.raises(Exception, match="nonzero"):  # unpatched: the boolean-mask select
        get_vision_window_index(fake_grid, spatial_merge_size=2, window_size=112, patch_size=14)
    with qwen2_5_vl.host_patches() as names, mode, MemoryTracer() as tracer:
        index, cu = modeling_qwen2_5_vl.get_vision_window_index(fake_grid, spatial_merge_size=2, window_size=112, patch_size=14)
        counted = [(r.op, r.dtype, r.nbytes) for r in tracer.live.values()]
    assert qwen2_5_vl.WINDOW_INDEX_ON_HOST in names
    assert modeling_qwen2_5_vl.get_vision_window_index is get_vision_window_index  # restored
    # the model's own values: 16 * 12 + 8 * 8 = 256 merged tokens; 4 * 3 + 2 * 2 = 16 windows of 16 tokens
    assert torch.equal(index.constant, want_index) and index.shape == (256,)
    assert torch.equal(cu.constant, want_cu) and cu.tolist()[-1] == 1024 and cu.shape == (17,)
    # only cu_window_seqlens lives on the device: int32 [17] = 68 bytes, one 512-byte block
    assert counted == [("clone.default", "int32", BLOCK)]


def test_autocast_runs_cudas_op_policy_on_the_cpu_key():
    """CUDA's autocast upcasts softmax, rsqrt, pow, layer_norm and the losses to fp32 and runs
    cat uncast (autocast_mode.h); CPU's autocast does neither. While the policy is active the
    CPU key follows CUDA's lists, and torch's own policy is back once it is left."""
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with emulation.CudaAutocastPolicy(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert {torch.softmax(x, -1).dtype, torch.rsqrt(x).dtype, x.pow(2).dtype} == {torch.float32}
        assert F.layer_norm(x, (8,)).dtype == torch.float32
        assert torch.softmax(x, -1, dtype=torch.bfloat16).dtype == torch.bfloat16  # an explicit dtype wins
        assert torch.cat([x, x.float()]).dtype == torch.float32  # the op's own type promotion
        assert x.sum().dtype == torch.float32  # fp32_set_opt_dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.softmax(x, -1).dtype == torch.bfloat16  # the CPU policy, restored


def test_autocast_keeps_one_bf16_copy_per_trainable_weight_until_the_forward_ends():
    """cached_cast (autocast_mode.cpp): the bf16 copy of an fp32 leaf that requires grad is made
    once and kept until the outermost autocast exits; a frozen weight is cast at every use.
    Two uses of a trainable [64, 64] weight: one 8 KiB copy; of a frozen one: two, gone at once."""
    with FakeTensorMode(), emulation.cuda_behaviour(fake=True), emulation.CudaAutocastPolicy():
        trained = torch.nn.Parameter(torch.empty(64, 64))
        frozen = torch.nn.Parameter(torch.empty(64, 64), requires_grad=False)
        x = torch.empty(16, 64)
        with MemoryTracer() as tracer:
            tracer.register([trained, frozen, x], "inputs")
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = F.linear(F.linear(x, trained), trained)  # noqa: F841
                copies = [r for r in tracer.live.values() if r.op == "_to_copy.default" and tuple(r.shape) == (64, 64)]
                assert len(copies) == 1 and copies[0].nbytes == 64 * 64 * 2  # 8192
                z = F.linear(F.linear(x, frozen), frozen)  # noqa: F841 - nothing requires grad: nothing saved
                copies = [r for r in tracer.live.values() if r.op == "_to_copy.default" and tuple(r.shape) == (64, 64)]
                assert len(copies) == 1
            # the cache is cleared on exit; the copy lives on because the second linear's input
            # requires grad, so its mm saved the copy for dX = dY W; it dies with the graph
            copies = [r for r in tracer.live.values() if r.op == "_to_copy.default" and tuple(r.shape) == (64, 64)]
            assert len(copies) == 1
            del y
            copies = [r for r in tracer.live.values() if r.op == "_to_copy.default" and tuple(r.shape) == (64, 64)]
            assert copies == []


def test_autocast_sdpa_casts_the_fp32_rope_outputs_before_picking_flash():
    """Under CUDA autocast, scaled_dot_product_attention (lower_precision_fp) casts q and k,
    fp32 after RoPE with fp32 cos/sin, to bf16 first, so the flash kernel runs and saves bf16
    q and k; without the cast the fp32 inputs would take the memory-efficient kernel."""
    with FakeTensorMode(), emulation.cuda_behaviour(fake=True), emulation.CudaAutocastPolicy():
        q = torch.empty(B, HEADS, S, D, requires_grad=True)
        with MemoryTracer() as tracer:
            tracer.register([q], "inputs")
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = F.scaled_dot_product_attention(q, q, q, is_causal=True)  # noqa: F841
            ops = Counter(r.op for r in tracer.live.values())
            assert ops["_scaled_dot_product_flash_attention.default"] >= 2  # out, logsumexp (+ rng)
            assert out.dtype == torch.bfloat16
