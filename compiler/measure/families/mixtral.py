"""mixtral for the measuring harness: the shared builder in `causal_lm.py`, plus `routing`.

Routing is data dependent: which experts a token goes to depends on the router's weights and
the token. transformers' default experts implementation (grouped_mm) never reads the routing
on the host, so no allocation can depend on it, and fake tensors (which carry no values) trace
it faithfully. `routing(mode)` checks that on real tensors: it replaces the router's top-k
choice with a fixed assignment, exactly balanced or the worst case, keeping the router's
softmax, the gather of the chosen probabilities and their renormalisation (so gradients reach
the router as in MixtralTopKRouter). Not used by the measured records (emulation lists no
routing): their routing is whatever the fake top-k gives, which no allocation reads.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from .causal_lm import load_config, make_batch, model_class_for, module_groups

__all__ = ["load_config", "make_batch", "model_class", "module_groups", "routing", "assignment", "ROUTINGS"]

ROUTINGS = ("balanced", "worst")


def model_class():
    return model_class_for("mixtral")


def assignment(tokens: int, top_k: int, n_experts: int, mode: str, device=None) -> torch.Tensor:
    """int64 [tokens, top_k] expert ids. balanced: token t takes experts (t * k + j) mod E, so
    every expert gets tokens * k / E pairs when E divides it; worst: every token takes experts
    0 .. k - 1, so k experts get every token and the others none (the most any expert can get:
    a token picks k distinct experts)."""
    if mode not in ROUTINGS:
        raise ValueError(f"routing {mode!r}: expected one of {', '.join(ROUTINGS)}")
    slots = torch.arange(top_k, device=device)
    if mode == "worst":
        return slots.expand(tokens, top_k).contiguous()
    return (torch.arange(tokens, device=device)[:, None] * top_k + slots[None, :]) % n_experts


@contextlib.contextmanager
def routing(mode: str) -> Iterator[str]:
    """MixtralTopKRouter.forward with a fixed assignment (`assignment`); yields its name."""
    from transformers.models.mixtral import modeling_mixtral

    router = modeling_mixtral.MixtralTopKRouter
    saved = router.forward

    def forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = torch.nn.functional.linear(hidden_states, self.weight)
        router_probs = torch.nn.functional.softmax(router_logits.float(), dim=-1)
        indices = assignment(router_probs.shape[0], self.top_k, self.num_experts, mode, router_probs.device)
        top_value = router_probs.gather(-1, indices)
        top_value = top_value / top_value.sum(dim=-1, keepdim=True)
        return router_logits, top_value, indices

    router.forward = forward
    try:
        yield f"moe-routing-{mode}"
    finally:
        router.forward = saved
