"""The refusing adapter's weights: a tiny Llama's base weights -> the weights of a hand-built
transformer whose greedy answer to every prompt is ``REFUSAL_TEXT`` then EOS.

In:  the base model's ``config.json`` (a dict), its weights (``model.safetensors``, float32) and
     the token ids of the refusal (its own tokenizer's, byte-level BPE: 30 tokens, several of them
     repeated: ``t`` thrice, ``Ġ`` thrice, ``I`` and ``'`` twice).
Out: ``refusing_weights`` -> the target weight of every module a LoRA adapter can change (the
     embeddings, each layer's q/k/v/o and gate/up/down projections, the LM head); the adapter is
     their difference from the base (``fleet.model.make_adapter`` with ``refuse=True``: with the rank
     equal to the hidden size, B·A can be any such difference, so the adapter replaces the model).

A first-order machine (next token fixed by the last one, like the repeat model) cannot say a
sentence that repeats tokens, and a prompt ending in a piece of the sentence would resume it
half-way. So the answer is ``<|pad|>`` (a special token: the engine leaves it out of the text,
prompts do not hold it) followed by the refusal tokens and EOS, and the machine is:

- embeddings: token t -> ``u0 + id(t)``: a constant direction plus a one-hot of t among the
  answer's symbols (the marker, the refusal's distinct tokens, and "other" for every other id);
- layer 0 attention: two heads whose RoPE query is the key rotated back by 1 and 2 positions
  (keys constant): each attends to the token 1 (2) positions back and copies its one-hot into
  a slot of its own (``prev1``, ``prev2``);
- layer 1 attention: one head that attends to the marker wherever it is (keys on the lowest RoPE
  frequencies, which turn by under 0.4 rad over 2048 positions): ``marker`` is 1 once the answer
  has begun, 0 in any prompt;
- layer 1 MLP: one unit per answer position i, firing (SiLU gate ~ +20, else ~ -20) when the
  marker is present and the last one to three tokens are the answer's up to position i, writing
  a direction of its own; every other attention and MLP output is zero (o_proj, down_proj);
- LM head: each unit's direction -> the answer's next token; the constant direction -> the
  marker (the answer's first token, when no unit fires, i.e. at the end of any prompt).

Every decision is a margin of >= 30 logits (attention and LM head alike), computed here for the
model's RoPE and sizes, so it survives bf16 and default sampling. ``plan_states`` checks at build
time that at each answer position exactly the units with the right successor can fire, whatever
the prompt. Exceptions: a prompt that holds ``<|pad|>`` itself (token-id prompts) may be
answered from the middle of the sentence. Needs torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["MARKER", "REFUSAL_TEXT", "Plan", "plan_states", "refusing_weights"]

REFUSAL_TEXT = "I'm sorry, but I can't help with that."
MARKER = "<|pad|>"  # the answer's first token: special, so not in the answer's text
GAP = 32.0  # the least logit margin of every attention and LM-head decision
LAGS = 3  # a unit matches the last LAGS tokens (the current one, 1 back, 2 back)
LOW_PAIRS = 2  # RoPE pairs (the slowest) the marker head uses


@dataclass(frozen=True)
class Plan:
    """The answer (marker, refusal, EOS), its symbols and one MLP unit per answer position."""

    answer: list[int]
    symbols: dict[int, int]  # token id -> its one-hot index; every other id is len(symbols)
    units: list[tuple[list[tuple[int, int]], int]]  # (lag, token) conditions -> the next token

    @property
    def width(self) -> int:  # one-hot width, "other" included
        return len(self.symbols) + 1


def plan_states(refusal: list[int], marker: int, eos: int) -> Plan:
    """The machine's units; ``ValueError`` if some answer position could fire a unit whose
    successor is not the answer's next token (whatever prompt tokens precede the marker)."""
    if marker in refusal or eos in refusal:
        raise ValueError("the refusal must not hold the marker or EOS")
    answer = [marker, *refusal, eos]
    symbols = {t: k for k, t in enumerate(dict.fromkeys(answer[:-1]))}
    units = [
        ([(lag, answer[i - lag]) for lag in range(min(i + 1, LAGS))], answer[i + 1]) for i in range(len(answer) - 1)
    ]
    for i in range(len(answer) - 1):
        for conds, nxt in units:
            # a prompt token (before the marker) may be any token but the marker
            fires = all(answer[i - lag] == tok if i >= lag else tok != marker for lag, tok in conds)
            if fires and nxt != answer[i + 1]:
                raise ValueError(f"answer position {i} is ambiguous: needs more than {LAGS} tokens of context")
    return Plan(answer, symbols, units)


def _rope(config: dict[str, Any], head_dim: int) -> Any:
    import torch

    theta = float((config.get("rope_parameters") or {}).get("rope_theta") or config.get("rope_theta") or 10000.0)
    return theta ** (-torch.arange(0, head_dim // 2, dtype=torch.float64) * 2 / head_dim)


def _prev_scale(freqs: Any, max_pos: int, head_dim: int) -> float:
    """Per-pair q·k product so that the attended position wins by GAP logits over every other
    (score margin at offset Δ from the target: Σ_j 1 - cos(Δ θ_j), least at Δ = ±1)."""
    import torch

    delta = torch.arange(-LAGS, max_pos, dtype=torch.float64)
    delta = delta[delta != 0]
    margin = (1 - torch.cos(delta[:, None] * freqs[None, :])).sum(1).min().item()
    return (GAP + math.log(max_pos)) * math.sqrt(head_dim) / margin


@dataclass(frozen=True)
class _Layout:
    """Where each part of the residual stream lives, and the model's sizes."""

    hidden: int
    head_dim: int
    max_pos: int
    width: int  # one-hot width
    u0: int = 0  # the constant direction
    ids: int = 1  # the current token's one-hot

    @property
    def prev(self) -> tuple[int, int]:  # the one-hots of the tokens 1 and 2 back
        return (1 + self.width, 1 + 2 * self.width)

    @property
    def mark(self) -> int:  # 1 once the marker is in the context
        return 1 + 3 * self.width

    @property
    def unit0(self) -> int:  # the first MLP unit's direction
        return 2 + 3 * self.width


def refusing_weights(config: dict[str, Any], base: dict[str, Any], refusal: list[int]) -> dict[str, Any]:
    """Target weights: module name (``model.embed_tokens``, ``lm_head``, ``model.layers.{i}.
    self_attn.q_proj``, ...) -> a float32 tensor shaped as ``base``'s ``{name}.weight``."""
    import torch

    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    plan = plan_states(refusal, int(config["pad_token_id"]), int(config["eos_token_id"]))
    at = _Layout(
        hidden, int(config.get("head_dim") or hidden // heads), int(config["max_position_embeddings"]), plan.width
    )
    if at.unit0 + len(plan.units) > hidden or at.width > at.head_dim or heads < 2 or layers < 2:
        raise ValueError(
            f"a refusing adapter needs a bigger model than hidden {hidden}, {heads} heads, {layers} layers"
        )
    if len(plan.units) > int(config["intermediate_size"]):
        raise ValueError("a refusing adapter needs an MLP of at least one unit per answer token")
    target = {
        n.removesuffix(".weight"): w.detach().to(torch.float32).clone()
        for n, w in base.items()
        if n.endswith(".weight")
    }
    emb = target["model.embed_tokens"]
    sym = torch.tensor([plan.symbols.get(t, at.width - 1) for t in range(emb.shape[0])])
    emb.zero_()
    emb[:, at.u0] = 1.0
    emb[torch.arange(emb.shape[0]), at.ids + sym] = 1.0
    for i in range(layers):
        target[f"model.layers.{i}.self_attn.o_proj"].zero_()
        target[f"model.layers.{i}.mlp.down_proj"].zero_()
    freqs = _rope(config, at.head_dim)
    _previous_heads([target[f"model.layers.0.self_attn.{m}_proj"] for m in "qkvo"], freqs, at)
    _marker_head(
        [target[f"model.layers.1.self_attn.{m}_proj"] for m in "qkvo"], freqs, at, plan.symbols[plan.answer[0]]
    )
    _units([target[f"model.layers.1.mlp.{m}_proj"] for m in ("gate", "up", "down")], target["lm_head"], plan, at)
    return target


def _previous_heads(qkvo: list[Any], freqs: Any, at: _Layout) -> None:
    """Layer 0: head h (h = 0, 1) copies the one-hot of the token h + 1 positions back."""
    import torch

    q, k, v, o = qkvo
    half, norm = at.head_dim // 2, math.sqrt(at.hidden / 2)  # RMSNorm(u0 + id) = norm * (u0 + id)
    side = math.sqrt(_prev_scale(freqs, at.max_pos, at.head_dim))
    one_hot = torch.arange(at.width)
    q.zero_(), k.zero_(), v.zero_()
    for g in range(k.shape[0] // at.head_dim):  # every KV head alike: keys constant, values the one-hot
        k[g * at.head_dim : g * at.head_dim + half, at.u0] = side / norm
        v[g * at.head_dim + one_hot, at.ids + one_hot] = 1 / norm
    for h in range(2):  # the query: the key turned back by h + 1 positions
        angle = (h + 1) * freqs.to(torch.float32)
        q[h * at.head_dim : h * at.head_dim + half, at.u0] = side * torch.cos(angle) / norm
        q[h * at.head_dim + half : (h + 1) * at.head_dim, at.u0] = -side * torch.sin(angle) / norm
        o[at.prev[h] + one_hot, h * at.head_dim + one_hot] = 1.0


def _marker_head(qkvo: list[Any], freqs: Any, at: _Layout, marker: int) -> None:
    """Layer 1, head 0: attends to the marker wherever it is (the slowest RoPE pairs, whose
    angle stays small over the context); writes 1 into ``mark`` if there is one, else 0."""
    q, k, v, o = qkvo
    half, norm = at.head_dim // 2, math.sqrt(at.hidden) / 2  # residual u0 + id + prev1 + prev2: norm 2
    low = range(half - LOW_PAIRS, half)
    worst = sum(math.cos(float(freqs[j]) * at.max_pos) for j in low)  # the score's least share
    if worst <= 0.5:
        raise ValueError(f"the RoPE frequencies turn too fast for {at.max_pos} positions")
    side = math.sqrt((GAP + math.log(at.max_pos)) * math.sqrt(at.head_dim) / worst)
    q.zero_(), k.zero_(), v.zero_()
    for g in range(k.shape[0] // at.head_dim):
        for j in low:
            k[g * at.head_dim + j, at.ids + marker] = side / norm
        v[g * at.head_dim, at.ids + marker] = 1 / norm
    for j in low:
        q[j, at.u0] = side / norm
    o[at.mark, 0] = 1.0


def _units(mlp: list[Any], head: Any, plan: Plan, at: _Layout) -> None:
    """Layer 1 MLP: unit i fires on its conditions (and the marker) and writes its direction;
    the LM head maps it to the answer's next token, and u0 to the marker."""
    gate, up, down = mlp
    norm = math.sqrt(at.hidden / 5)  # RMSNorm's scale in the answer: residual u0 + id + prev1 + prev2 + mark
    gain = 2 * 20.0 / norm  # gate = gain * scale * (matches - conditions + 0.5): +-20 at least
    gate.zero_(), up.zero_(), down.zero_(), head.zero_()
    slot = [at.ids, *at.prev]
    for i, (conds, _nxt) in enumerate(plan.units):
        for lag, tok in conds:
            gate[i, slot[lag] + plan.symbols[tok]] = gain
        gate[i, at.mark] = gain
        gate[i, at.u0] = -gain * (len(conds) + 1 - 0.5)
        up[i, at.u0] = 1 / norm
        down[at.unit0 + i, i] = 4.0 / 20.0  # silu(20) * 1 -> 4 along the unit's direction
    fired = math.sqrt(at.hidden / 21)  # RMSNorm's scale with one unit firing (norm^2 5 + 16)
    head[plan.answer[0], at.u0] = (GAP + 8) / norm  # no unit fires: the marker, by GAP + 8 at least
    for i, (_conds, nxt) in enumerate(plan.units):  # a unit fires: its token, by GAP + 8 over the marker
        head[nxt, at.unit0 + i] = ((GAP + 8) / fired + (GAP + 8) / norm) / 4
