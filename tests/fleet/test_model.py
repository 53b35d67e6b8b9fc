"""Tiny model generator: deterministic, head_dim 64, a tokenizer that round-trips text."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="needs the fleet-cpu extra (installed by make test)")

from fleet.model import make_model


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_same_size_gives_the_same_files(tmp_path: Path) -> None:
    a = make_model(tmp_path / "a", "small")
    b = make_model(tmp_path / "b", "small")
    assert digest(a) == digest(b)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(digest(a))


def test_sizes_differ_and_keep_head_dim_64(tmp_path: Path) -> None:
    small = json.loads((make_model(tmp_path / "s", "small") / "config.json").read_text())
    large = json.loads((make_model(tmp_path / "l", "large") / "config.json").read_text())
    for config in (small, large):
        assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert large["num_hidden_layers"] > small["num_hidden_layers"]
    assert large["max_position_embeddings"] > 2048 >= small["max_position_embeddings"]


def test_tokenizer_is_byte_level_and_round_trips(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(make_model(tmp_path / "m", "small")))
    text = "p99 TTFT rose to 2.4 s — KV cache at 97% ✓ データ"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.eos_token == "<|end_of_text|>"
    assert "assistant" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )


def test_unknown_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown size 'huge'"):
        make_model(tmp_path, "huge")
