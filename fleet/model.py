"""Tiny model generator: (directory, size) -> a random-weight Llama model vLLM can serve.

In:  a target directory and a size (``small`` or ``large``).
Out: ``config.json``, ``model.safetensors``, ``generation_config.json`` and a byte-level BPE
     tokenizer (``tokenizer.json`` + config with a chat template) in that directory.

Offline and deterministic: fixed seed, tokenizer trained on a fixed corpus; the same size
gives the same files. Output text is gibberish, but the engine's scheduling, batching, KV
cache, prefix cache, preemption and metrics are the real ones. head_dim is 64 because vLLM's
CPU attention rejects smaller heads. Needs torch, transformers and tokenizers, which come with
the ``fleet-cpu`` / ``fleet-gpu`` extras.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SIZES", "ModelSize", "make_model"]

SEED = 20261129
VOCAB_SIZE = 1024


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
    from transformers import PreTrainedTokenizerFast

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
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKENS[0],
        eos_token=SPECIAL_TOKENS[1],
        pad_token=SPECIAL_TOKENS[2],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))


def make_model(directory: Path, size: str = "small") -> Path:
    """Write a tiny model of ``size`` into ``directory`` (created); returns the directory."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}: choose {' or '.join(SIZES)}")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import torch
        from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            f"making a model needs torch and transformers ({exc.name} is missing): "
            "pip install '.[fleet-cpu]' (or '.[fleet-gpu]' on a CUDA machine)"
        ) from exc

    directory.mkdir(parents=True, exist_ok=True)
    _tokenizer(directory)
    vocab = json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]
    dims = SIZES[size]
    config = LlamaConfig(
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
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(directory), safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(str(directory))
    return directory
