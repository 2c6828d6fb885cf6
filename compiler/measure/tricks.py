"""Training-setup tricks the harness can measure: a fused linear cross-entropy loss, packed
batches, and activation offloading to host memory.

Contract: `install_fused_loss(model, on_loss)` makes a text-only …ForCausalLM compute its
training loss the way Liger-Kernel's patched forward does (TrainingArguments
use_liger_kernel=True), through `FusedLinearCrossEntropy`, a pure-torch stand-in for
Liger's Triton function that allocates exactly what Liger allocates on CUDA (Liger needs
Triton and a GPU; the stand-in runs on fake tensors). `offloaded()` is the context the
forward runs in with activation offloading: torch.autograd.graph.save_on_cpu's hooks with
the host standing as the `meta` device, which the tracer does not count. Packed batches are
built by the family (`causal_lm.make_batch`).

The stand-in, allocation by allocation, against Liger-Kernel
src/liger_kernel/ops/fused_linear_cross_entropy.py (commit 00eba634),
`fused_linear_cross_entropy_forward` with reduction "mean", no bias, no ce_weight, no z-loss,
accum_dtype None, on CUDA sm80+ (where `_can_use_mm_out` holds: grad mode is off inside the
autograd.Function and the input and weight dtypes match):
- chunk size: inc_factor = cdiv(V, H); chunk = min(next_power_of_2(cdiv(BT, inc_factor)), BT);
- grad_input = zeros_like(_input); grad_weight = zeros_like(weight) when the weight needs a
  gradient and the input requires grad; loss_1d = zeros(BT) fp32; target_mask = target != -100
  and its sum (`.item()` on the host: the stand-in allocates the scalar and drops it, as the
  real one is dropped once read);
- logits_storage = empty(chunk, V) in the input dtype; per chunk `mm(x, W.t(), out=...)`; the
  cross-entropy kernel writes the loss into loss_1d and the logits' gradient over the logits
  in place (no allocation, values irrelevant on fake tensors, so no op here);
  `mm(grad_logits, W, out=grad_input[chunk])`; grad_weight by `addmm(..., out=grad_weight)`
  for 16-bit dtypes, else the fallback `grad_weight += mm(grad_logits.t(), x).float()`;
- `del logits_storage`; loss = sum(loss_1d); save_for_backward(grad_input, grad_weight);
- backward: `torch.equal(grad_output, torch.tensor(1.0, device=...))` (one fp32 scalar);
  grad_output is 1 (the loss is the last op; an fp16 loss scale multiplies in place), so the
  saved tensors are returned as they are.
LigerForCausalLMLoss (src/liger_kernel/transformers/model/loss_utils.py) pads the labels by
one and makes the shifted copy, and flattens the hidden states with a view.
"""

from __future__ import annotations

import contextlib
import types
from typing import Callable, Iterator

import torch

FUSED_LOSS = "fused-linear-cross-entropy-as-torch-chunks"
OFFLOAD_HOST_AS_META = "activation-offload-host-as-meta"
IGNORE_INDEX = -100  # transformers' and Liger's ignore_index
LOW_PRECISION = (torch.float16, torch.bfloat16)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def chunk_size(tokens: int, hidden: int, vocab: int) -> int:
    """Liger's rule: the chunk's logits stay near the size of the input."""
    return min(_next_power_of_2(_cdiv(tokens, _cdiv(vocab, hidden))), tokens)


class FusedLinearCrossEntropy(torch.autograd.Function):
    """Liger's fused lm_head + cross-entropy, allocation for allocation (see the module doc)."""

    @staticmethod
    def forward(ctx, x, weight, target):
        tokens, hidden = x.shape
        vocab = weight.shape[0]
        chunk = chunk_size(tokens, hidden, vocab)
        grad_input = torch.zeros_like(x)
        grad_weight = torch.zeros_like(weight) if weight.requires_grad and x.requires_grad else None
        loss_1d = torch.zeros(tokens, dtype=torch.float32, device=x.device)
        target_mask = target != IGNORE_INDEX
        target_mask.sum()  # .item(): the count is read on the host and the scalar dropped
        logits_storage = torch.empty((chunk, vocab), dtype=x.dtype, device=x.device)
        for start in range(0, tokens, chunk):
            end = min(start + chunk, tokens)
            x_chunk = x[start:end]
            logits = logits_storage[: end - start]
            torch.mm(x_chunk, weight.t(), out=logits)
            # NB: Liger's cross-entropy kernel turns `logits` into its gradient in place here
            torch.mm(logits, weight, out=grad_input[start:end])
            if grad_weight is not None:
                if x.dtype in LOW_PRECISION and grad_weight.dtype == x.dtype:
                    grad_weight.addmm_(logits.t(), x_chunk)
                else:
                    grad_weight += torch.mm(logits.t(), x_chunk).float()
        del logits_storage, target_mask
        loss = torch.sum(loss_1d)
        ctx.save_for_backward(grad_input, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        grad_input, grad_weight = ctx.saved_tensors
        torch.ones((), dtype=torch.float32, device=grad_output.device)  # torch.tensor(1.0, device=...)
        return grad_input, grad_weight, None


def causal_lm_loss(hidden_states, weight, labels, hidden_size: int):
    """LigerForCausalLMLoss: pad and shift the labels, flatten, fused loss."""
    labels = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)
    shift_labels = labels[..., 1:].contiguous()
    return FusedLinearCrossEntropy.apply(hidden_states.view(-1, hidden_size), weight, shift_labels.view(-1))


def install_fused_loss(model, on_loss: Callable[[], None]) -> None:
    """Give a text-only …ForCausalLM Liger's training forward (lce_forward, skip_logits):
    the decoder, then the fused loss on its last hidden state; no logits are returned."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    def forward(self, input_ids=None, labels=None, attention_mask=None, position_ids=None, **kwargs):
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        hidden_states = outputs.last_hidden_state
        on_loss()
        loss = causal_lm_loss(hidden_states, self.lm_head.weight, labels, self.config.hidden_size)
        return CausalLMOutputWithPast(loss=loss, logits=None)

    model.forward = types.MethodType(forward, model)


@contextlib.contextmanager
def offloaded() -> Iterator[None]:
    """torch.autograd.graph.save_on_cpu(pin_memory=False), with `meta` standing for the host.

    save_on_cpu packs every saved tensor (parameters included) as (device, tensor.cpu()) and
    unpacks it with `.to(device)` when its backward node runs. In the traced run the device
    itself is the CPU, so `.cpu()` would copy within it; `meta` is a device the tracer does
    not count, and `.to(device)` of a meta tensor allocates the same fresh device copy.
    """

    def pack(tensor):
        return tensor.device, tensor.to("meta")

    def unpack(packed):
        device, tensor = packed
        return tensor.to(device)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
