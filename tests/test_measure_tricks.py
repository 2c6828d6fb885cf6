"""The measuring side of the training-setup tricks: the fused loss stand-in allocates what
Liger allocates, and offloaded saved tensors leave the traced device."""

import pytest

torch = pytest.importorskip("torch", reason="measuring needs torch")
pytest.importorskip("transformers", reason="measuring needs transformers")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from compiler.library.formula import FUNCTIONS  # noqa: E402
from compiler.measure import tricks  # noqa: E402
from compiler.measure.tracer import MemoryTracer  # noqa: E402


@pytest.mark.parametrize(
    "tokens, hidden, vocab, chunk",
    [
        (16384, 896, 151936, 128),  # cdiv(151936, 896) = 170; next_pow2(cdiv(16384, 170) = 97) = 128
        (16384, 4096, 32000, 2048),  # Liger's own comment: inc_factor 8, chunk 2048
        (100, 4096, 4096, 100),  # inc_factor 1: next_pow2(100) = 128, capped at BT = 100
    ],
)
def test_chunk_size_is_liger_rule_and_the_formula_rule(tokens, hidden, vocab, chunk):
    assert tricks.chunk_size(tokens, hidden, vocab) == chunk
    cdiv, next_pow2 = FUNCTIONS["ceil_div"], FUNCTIONS["next_pow2"]
    assert min(next_pow2(cdiv(tokens, cdiv(vocab, hidden))), tokens) == chunk


def test_fused_loss_forward_allocates_one_chunk_of_logits():
    tokens, hidden, vocab = 1024, 64, 4096  # inc_factor 64, chunk next_pow2(16) = 16
    with FakeTensorMode(), MemoryTracer(granularity=1) as tracer:
        x = torch.empty(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
        w = torch.empty(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
        target = torch.zeros(tokens, dtype=torch.long)
        base = tracer.total
        loss = tricks.FusedLinearCrossEntropy.apply(x, w, target)
        after = tracer.total - base
        peak = max(p.allocated for p in tracer.peaks.values()) - base
        loss.backward()
    # kept after forward: grad_input 1024 * 64 * 2 + grad_weight 4096 * 64 * 2 + the loss 4
    assert after == 131_072 + 524_288 + 4
    # at the peak also loss_1d 1024 * 4, the mask 1024 and the logits 16 * 4096 * 2 (never 1024 * 4096)
    assert peak == 131_072 + 524_288 + 4_096 + 1_024 + 131_072
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


def test_offloaded_saved_tensors_leave_the_device():
    with FakeTensorMode(), MemoryTracer(granularity=1, device="cpu") as tracer:
        x = torch.empty(256, 256, requires_grad=True)  # 262_144 B
        base = tracer.total
        with tricks.offloaded():
            y = x.sin()  # saves x: a host copy, nothing new on the device but y
        kept = tracer.total - base
        y.sum().backward()
    assert kept == 262_144  # y only; x's saved copy went to the host (meta)


def _tied_step(fused: bool):
    """A tied embedding's step, bf16: lookup, tanh, then the fused loss or nn.Linear's head and
    cross-entropy, then its backward: the embedding (one table 4096 x 64 x 2 = 524_288 B) and the step."""
    vocab, hidden, tokens = 4096, 64, 16
    emb = torch.nn.Embedding(vocab, hidden, dtype=torch.bfloat16)
    ids = torch.zeros(tokens, dtype=torch.long)

    def step():
        h = emb(ids).tanh()
        if fused:
            loss = tricks.FusedLinearCrossEntropy.apply(h, emb.weight, ids)
        else:
            loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, emb.weight).float(), ids)
        loss.backward()

    return emb, step


@pytest.mark.parametrize("fused, summed", [(True, "aten::add_"), (False, "aten::add")], ids=["fused-loss", "linear-head"])
def test_torch_sums_a_tied_embeddings_gradients_in_place_only_into_a_tensor_of_its_own(fused, summed):
    """Real tensors, no tracer: the input buffer adds the embedding's gradient into the fused
    loss's `grad_weight` in place, and into nn.Linear's (a view) out of place. NB: under the
    tracer real tensors sum out of place in both (the tracer takes each storage's Python object,
    probably a second holder), so the tracer's own figures are pinned on fake tensors below."""
    from torch.profiler import ProfilerActivity, profile

    _, step = _tied_step(fused)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    names = [e.name for e in prof.events()]
    assert [n for n in names if n in ("aten::add", "aten::add_")] == [summed]


@pytest.mark.parametrize("fused", [True, False], ids=["fused-loss", "linear-head"])
def test_the_traced_input_buffer_sums_as_torch_does(fused):
    """Fake tensors under the tracer, with and without emulation.FakeOpsAsCuda. The fused
    loss's backward peak with it: grad_weight + embedding_dense_backward's table + tanh's output
    and its gradient (16 x 64 x 2 each) + the loss and its gradient (fp32 scalars) = 2 * 524_288
    + 2 * 2_048 + 8 = 1_052_680; without it the sum's third table at add.Tensor, tanh's gradient
    freed by then: 3 * 524_288 + 2_048 + 8 = 1_574_920. nn.Linear's head sums out of place either
    way: 1_574_920 (its loss fp32 too)."""
    import contextlib

    from compiler.measure import emulation

    peaks = []
    for emulate in (True, False):
        with FakeTensorMode():
            emb, step = _tied_step(fused)
            with emulation.FakeOpsAsCuda() if emulate else contextlib.nullcontext(), MemoryTracer(granularity=1) as tracer:
                tracer.register([emb.weight], "parameters")
                base = tracer.total
                step()
                peaks.append(max(p.allocated for p in tracer.peaks.values()) - base)
    assert peaks == ([1_052_680, 1_574_920] if fused else [1_574_920, 1_574_920])
