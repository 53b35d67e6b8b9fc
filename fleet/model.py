"""Tiny model generator: (directory, size) -> a random-weight Llama model vLLM can serve, and
LoRA adapters for it.

``make_model``
    In:  a target directory, a size (``small`` or ``large``) and ``repeat``.
    Out: ``config.json``, ``model.safetensors``, ``generation_config.json`` and a byte-level BPE
         tokenizer (``tokenizer.json`` + config with a chat template) in that directory.
    ``repeat=True`` writes a model whose greedy next token is fixed by the previous one: a
    permutation of the ordinary token ids (never a special token: no EOS, pad or BOS) made of
    ONE cycle through all of them (``REPEAT_IDS``, 645 long): ``successor_chain``. Its
    output does not repeat itself within a request (up to 645 tokens), so what n-gram
    speculative decoding's drafts win depends on the prompt: a prompt that already holds the
    continuation (an "edit": a chain segment, then its first tokens again) gets its drafts
    accepted, a random one hardly any. It is the normal model with attention ``o_proj`` and MLP
    ``down_proj`` zeroed (the residual stream stays the token's embedding, whatever the
    context; the layers still compute, at the same cost) and ``lm_head`` row ``u`` set to the
    scaled, normalised embedding of ``perm⁻¹(u)``: the largest logit after token ``t`` is
    ``perm(t)``'s. Special tokens' rows are zero (never chosen).
``successor_chain`` (``fleet.chain``, re-exported)
    In:  a start token id and a count n. Out: the n tokens the repeat model generates greedily
         after it. Pure Python (no torch): the traffic generator and the simulator read it.
``make_adapter``
    In:  a target directory, the base model's directory (its ``config.json`` gives the shapes),
         a rank, a seed and ``refuse``.
    Out: a PEFT LoRA adapter: ``adapter_config.json`` (``peft_type`` LORA, ``r``, ``lora_alpha``
         2·r, ``target_modules`` q_proj and v_proj, ``base_model_name_or_path``) and
         ``adapter_model.safetensors`` with ``base_model.model.model.layers.{i}.self_attn.
         {q,v}_proj.lora_{A,B}.weight`` (A: r × hidden, B: out × r), small random values.
         ``refuse=True`` (rank >= the hidden size; ``lora_alpha`` = r, so B·A counts as is):
         the refusing adapter, whose answer to any prompt is ``REFUSAL_TEXT`` then EOS (after
         ``<|pad|>``, a special token the engine leaves out of the text). Its ``target_modules``
         are every module LoRA can change (``embed_tokens``: ``lora_embedding_{A,B}``, each
         layer's q/k/v/o and gate/up/down projections, ``lm_head``) and each B·A is exactly the
         change from the base's weights (read from ``base_dir``) to those of a hand-built
         transformer (``fleet.refusal``: attention to the previous two tokens and to the
         answer's start, an MLP unit per answer position), with margins of >= 30 logits.
         vLLM serves either with ``--enable-lora --lora-modules NAME=DIR`` (and
         ``--max-lora-rank`` at least r: 128 or 256 for a refusing one).

Offline and deterministic: fixed seed, tokenizer trained on a fixed corpus; the same arguments
give the same files. Output text is gibberish, but the engine's scheduling, batching, KV
cache, prefix cache, preemption, speculative decoding, LoRA slots and metrics are the real ones.
head_dim is 64 because vLLM's CPU attention rejects smaller heads. Needs torch, transformers
and tokenizers (and safetensors, which they bring), from the ``fleet-cpu`` / ``fleet-gpu`` extras.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.chain import REPEAT_IDS, SEED, successor_chain, successors
from fleet.refusal import REFUSAL_TEXT

__all__ = [
    "REFUSAL_TEXT",
    "REPEAT_IDS",
    "SIZES",
    "ModelSize",
    "make_adapter",
    "make_model",
    "refusal_tokens",
    "successor_chain",
    "successors",
]

VOCAB_SIZE = 1024
# the repeat model's winning logit; any other token's is this times a cosine of two random
# 128-dim embeddings (at most ~0.35): a margin that survives bf16
REPEAT_LOGIT = 24.0
ADAPTER_SEED = 20261201
ADAPTER_TARGETS = ("q_proj", "v_proj")
# the refusing adapter changes every module a LoRA adapter can (fleet.refusal)
REFUSING_TARGETS = (
    "embed_tokens",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "lm_head",
)


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    intermediate_size: int
    max_position_embeddings: int


SIZES: dict[str, ModelSize] = {
    # head_dim = hidden_size / num_attention_heads = 64 for both
    "small": ModelSize(128, 2, 1, 2, 256, 2048),
    "large": ModelSize(256, 4, 2, 4, 512, 8192),
}

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_CORPUS = [
    "The fleet serves requests from many tenants across small and large models.",
    "Time to first token grows when the KV cache saturates and requests wait in the queue.",
    "Inter-token latency reflects decode batch size, preemptions and memory bandwidth.",
    "A model router sends easy requests to the small model and hard ones to the large model.",
    "Prefix caching reuses the KV blocks of shared system prompts between requests.",
    "Cost per million tokens is GPU spend divided by tokens served, idle time included.",
    "def handler(request):\n    return {'status': 200, 'tokens': len(request.prompt)}\n",
    "SELECT model, quantile(0.99)(ttft_seconds) FROM requests GROUP BY model;",
    "0123456789 !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ abcdefghijklmnopqrstuvwxyz",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ ÀÉÎÕÜ ß ñ ç 数据 データ данные",
]
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]


def _tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 8, trainer=trainer)
    fast = _transformers().PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKENS[0],
        eos_token=SPECIAL_TOKENS[1],
        pad_token=SPECIAL_TOKENS[2],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))


def _transformers() -> Any:
    """The ``transformers`` module, untyped: a dynamic boundary. Its stubs leave the constructors
    used here unannotated (``no-untyped-call`` under ``--strict``) and reject the ``torch_dtype``
    its configs accept (transformers 5 stores it as ``dtype``)."""
    import transformers

    return transformers


def _imports() -> None:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import torch  # noqa: F401

        _transformers().utils.logging.disable_progress_bar()
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            f"making a model needs torch and transformers ({exc.name} is missing): "
            "pip install '.[fleet-cpu]' (or '.[fleet-gpu]' on a CUDA machine)"
        ) from exc


def _make_repeat(model: Any, nxt: dict[int, int]) -> None:
    """Turn a random Llama into one whose greedy successor of token t is ``nxt[t]`` (in place)."""
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        emb = model.model.embed_tokens.weight
        unit = emb / emb.norm(dim=1, keepdim=True)
        # the final RMSNorm scales a token's embedding to norm sqrt(hidden): row u = the unit
        # embedding of the token that u follows, scaled so the winning logit is REPEAT_LOGIT
        scale = REPEAT_LOGIT / math.sqrt(emb.shape[1])
        head = torch.zeros_like(model.lm_head.weight)
        for t, u in nxt.items():
            head[u] = unit[t] * scale
        model.lm_head.weight.copy_(head)


def make_model(directory: Path, size: str = "small", repeat: bool = False) -> Path:
    """Write a tiny model of ``size`` into ``directory`` (created); returns the directory.
    ``repeat``: greedy output follows ``successor_chain`` (see the module doc)."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}: choose {' or '.join(SIZES)}")
    _imports()
    import torch

    hf = _transformers()
    directory.mkdir(parents=True, exist_ok=True)
    _tokenizer(directory)
    vocab = json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]
    dims = SIZES[size]
    config = hf.LlamaConfig(
        vocab_size=max(VOCAB_SIZE, len(vocab)),
        hidden_size=dims.hidden_size,
        intermediate_size=dims.intermediate_size,
        num_hidden_layers=dims.num_hidden_layers,
        num_attention_heads=dims.num_attention_heads,
        num_key_value_heads=dims.num_key_value_heads,
        max_position_embeddings=dims.max_position_embeddings,
        bos_token_id=vocab[SPECIAL_TOKENS[0]],
        eos_token_id=vocab[SPECIAL_TOKENS[1]],
        pad_token_id=vocab[SPECIAL_TOKENS[2]],
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = hf.LlamaForCausalLM(config).to(torch.float32)
    if repeat:
        special = {vocab[t] for t in SPECIAL_TOKENS}
        if sorted(set(vocab.values()) - special) != list(REPEAT_IDS):
            raise RuntimeError(f"the tokenizer's ordinary ids are no longer {REPEAT_IDS}: update REPEAT_IDS")
        _make_repeat(model, successors())
    model.save_pretrained(str(directory), safe_serialization=True)
    hf.GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(str(directory))
    return directory


def _adapter_base(base_dir: Path) -> dict[str, Any]:
    """The base model's config.json; ``ValueError`` if missing or not a Llama config."""
    try:
        config: dict[str, Any] = json.loads((base_dir / "config.json").read_text())
        for key in ("hidden_size", "num_attention_heads", "num_hidden_layers"):
            int(config[key])
    except FileNotFoundError:
        raise ValueError(
            f"base model {base_dir} has no config.json (make one with `fleetscope fleet make-model`)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"base model {base_dir}/config.json is not a Llama config: {exc!r}") from None
    return config


def make_adapter(
    directory: Path, base_dir: Path, rank: int = 8, seed: int = ADAPTER_SEED, refuse: bool = False
) -> Path:
    """Write a LoRA adapter of ``rank`` for the model in ``base_dir`` into ``directory``
    (created); returns the directory. ``refuse``: the refusing adapter (``REFUSAL_TEXT``; rank
    at least the hidden size), else a random one. ``ValueError`` if ``base_dir`` has no usable
    config.json (or, refusing, weights and tokenizer) or the rank is too small."""
    if rank < 1:
        raise ValueError(f"the rank must be a whole number >= 1, not {rank}")
    config = _adapter_base(base_dir)
    _imports()
    from safetensors.torch import save_file

    if refuse:
        tensors, targets = _refusing_lora(base_dir, config, rank), list(REFUSING_TARGETS)
    else:
        tensors, targets = _random_lora(config, rank, seed), list(ADAPTER_TARGETS)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_dir),
        "r": rank,
        # vLLM and PEFT scale B·A by lora_alpha / r: the refusing adapter's B·A is the exact delta
        "lora_alpha": rank if refuse else 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
    }
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
    return directory


def _random_lora(config: dict[str, Any], rank: int, seed: int) -> dict[str, Any]:
    """Small random A and B for q_proj and v_proj of every layer."""
    import torch

    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    outs = {"q_proj": heads * head_dim, "v_proj": kv_heads * head_dim}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(int(config["num_hidden_layers"])):
        for module in ADAPTER_TARGETS:
            prefix = f"base_model.model.model.layers.{i}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, generator=gen) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(outs[module], rank, generator=gen) * 0.02
    return tensors


def refusal_tokens(base_dir: Path) -> list[int]:
    """``REFUSAL_TEXT`` in the token ids of the tokenizer in ``base_dir`` (byte-level BPE)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(base_dir / "tokenizer.json"))
    ids: list[int] = tok.encode(REFUSAL_TEXT, add_special_tokens=False).ids
    if tok.decode(ids) != REFUSAL_TEXT:
        raise ValueError(f"the tokenizer in {base_dir} does not round-trip the refusal")
    return ids


def _low_rank(delta: Any, rank: int) -> tuple[Any, Any]:
    """(A, B) with B·A = ``delta`` (out x in) exactly: an identity on the smaller side."""
    import torch

    out, inp = delta.shape
    a, b = torch.zeros(rank, inp), torch.zeros(out, rank)
    if inp <= rank:
        a[:inp] = torch.eye(inp)
        b[:, :inp] = delta
    elif out <= rank:
        a[:out] = delta
        b[:, :out] = torch.eye(out)
    else:
        raise ValueError(f"a {out} x {inp} change needs a rank of at least {min(out, inp)}, not {rank}")
    return a.contiguous(), b.contiguous()


def _refusing_lora(base_dir: Path, config: dict[str, Any], rank: int) -> dict[str, Any]:
    """The refusing adapter's tensors: every target module's (``fleet.refusal``) change from
    the base, as PEFT names it (embeddings: ``lora_embedding_A`` r x vocab, ``_B`` hidden x r)."""
    from safetensors.torch import load_file

    from fleet.refusal import refusing_weights

    if rank < int(config["hidden_size"]):
        raise ValueError(f"a refusing adapter needs a rank of at least the hidden size ({config['hidden_size']})")
    try:
        base = load_file(str(base_dir / "model.safetensors"))
        refusal = refusal_tokens(base_dir)
    except (OSError, ValueError, RuntimeError) as exc:  # safetensors and tokenizers raise these
        raise ValueError(f"base model {base_dir}: no usable weights and tokenizer ({exc})") from None
    targets = refusing_weights(config, base, refusal)
    tensors = {}
    for name, weight in targets.items():
        delta = weight - base[f"{name}.weight"].float()
        if name == "model.embed_tokens":  # PEFT: embedding delta = (B·A)^T
            a, b = _low_rank(delta.T, rank)
            tensors[f"base_model.model.{name}.lora_embedding_A"] = a
            tensors[f"base_model.model.{name}.lora_embedding_B"] = b
        elif name.rsplit(".", 1)[-1] in REFUSING_TARGETS:
            a, b = _low_rank(delta, rank)
            tensors[f"base_model.model.{name}.lora_A.weight"] = a
            tensors[f"base_model.model.{name}.lora_B.weight"] = b
    return tensors
