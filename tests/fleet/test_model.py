"""Tiny model generator: deterministic, head_dim 64, a tokenizer that round-trips text; the
repeating model and LoRA adapters for speculative decoding and adapter tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fleet.model import REPEAT_IDS, make_adapter, make_model, successor_chain, successors
from tests.conftest import need

need("transformers", "the model generator needs the fleet-cpu extra (installed by make test)")


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


def test_repeat_model_greedy_output_follows_the_successor_chain(tmp_path: Path) -> None:
    """n-gram speculative decoding needs a model whose output a prompt can predict: greedy, the
    next token is fixed by the previous one, exactly as the torch-free ``successor_chain`` says
    (which the traffic generator uses to write predictable prompts), whatever came before."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    directory = make_model(tmp_path / "r", "small", repeat=True)
    tok = AutoTokenizer.from_pretrained(str(directory))
    model = LlamaForCausalLM.from_pretrained(str(directory))
    special = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}
    prompts = [tok("The fleet serves requests").input_ids, tok("SELECT model FROM requests;").input_ids]
    prompts += [[7] + successor_chain(7, 30), [900, 5, 800, 17, 640]]  # a chain; ids beyond the tokenizer
    for prompt in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)[0].tolist()
        generated = out[len(prompt) :]
        assert generated == successor_chain(prompt[-1], 64), prompt
        assert not special & set(generated) and len(set(generated)) == 64, "no special token, no repeat"


def test_repeat_model_is_deterministic_and_differs_from_the_normal_one(tmp_path: Path) -> None:
    normal = digest(make_model(tmp_path / "n", "small"))
    a = digest(make_model(tmp_path / "a", "small", repeat=True))
    b = digest(make_model(tmp_path / "b", "small", repeat=True))
    assert a == b
    assert a["model.safetensors"] != normal["model.safetensors"]
    assert a["tokenizer.json"] == normal["tokenizer.json"], "the same tokenizer: prompts mean the same tokens"


def test_successors_are_one_cycle_through_the_ordinary_token_ids(tmp_path: Path) -> None:
    """One long cycle: a request's output (hundreds of tokens) never repeats itself, so only a
    prompt that holds the continuation gets n-gram drafts accepted."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(make_model(tmp_path / "m", "small")))
    ordinary = sorted(set(tok.get_vocab().values()) - {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id})
    assert list(REPEAT_IDS) == ordinary
    nxt = successors()
    assert sorted(nxt) == ordinary and sorted(nxt.values()) == ordinary  # a permutation of exactly these
    chain = successor_chain(REPEAT_IDS[0], len(REPEAT_IDS))
    assert chain[-1] == REPEAT_IDS[0] and sorted(chain) == ordinary, "one cycle through all of them"
    assert successor_chain(chain[9], 5) == chain[10:15] and successors() == nxt
    with pytest.raises(ValueError, match="not an ordinary token id"):
        successor_chain(1, 5)  # EOS


def test_adapter_matches_its_base_shapes(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    base = make_model(tmp_path / "large", "large")
    adapter = make_adapter(tmp_path / "lora", base, rank=4)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    assert config["target_modules"] == ["q_proj", "v_proj"]
    assert config["base_model_name_or_path"] == str(base)
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    assert len(tensors) == 4 * 2 * 2  # 4 layers x {q, v} x {A, B}
    prefix = "base_model.model.model.layers.3.self_attn"
    assert tuple(tensors[f"{prefix}.q_proj.lora_A.weight"].shape) == (4, 256)
    assert tuple(tensors[f"{prefix}.q_proj.lora_B.weight"].shape) == (256, 4)
    assert tuple(tensors[f"{prefix}.v_proj.lora_B.weight"].shape) == (128, 4)  # 2 KV heads x 64
    assert 0 < float(tensors[f"{prefix}.v_proj.lora_B.weight"].abs().max()) < 0.2
    again = make_adapter(tmp_path / "again", base, rank=4)
    assert digest(adapter) == digest(again)


def test_adapter_needs_a_base_with_a_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="has no config.json"):
        make_adapter(tmp_path / "lora", tmp_path / "nowhere")


def test_cli_makes_a_repeat_model_and_an_adapter_for_it(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fleetscope.cli import app

    runner = CliRunner()
    made = runner.invoke(app, ["fleet", "make-model", str(tmp_path / "m"), "--size", "small", "--repeat"])
    assert made.exit_code == 0, made.output
    assert digest(tmp_path / "m") == digest(make_model(tmp_path / "ref", "small", repeat=True))
    made = runner.invoke(
        app, ["fleet", "make-adapter", str(tmp_path / "a"), "--base", str(tmp_path / "m"), "--rank", "16"]
    )
    assert made.exit_code == 0, made.output
    assert json.loads((tmp_path / "a" / "adapter_config.json").read_text())["r"] == 16
