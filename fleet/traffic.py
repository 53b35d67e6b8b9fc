"""Traffic mix and scenarios: YAML timelines -> the request to send next.

In:  a scenario file (``fleet/scenarios/NAME.yaml`` or any path): a base ``mix`` (arrival
     process, tenants, prompt/output length distributions, long-context share, shared-prefix
     share, model mix (a LoRA adapter is addressed by its name, as a model: a share per adapter,
     per tenant too), streaming share, how predictable the text is to a speculative draft),
     ``phases`` that change the mix at given times, and
     ``events`` (kill or restart a replica).
Out: ``Scenario.mix_at(t)`` (the mix in force at scenario time t), ``next_gap`` (Poisson
     arrivals with diurnal shape and bursts) and ``plan_request`` (tenant, model, prompt token
     ids, max_tokens, streaming, the answer's own length) drawn from a seeded ``random.Random``.

Output lengths: each request's answer has a length of its own (``output_tokens``); the client
asks for ``max_tokens`` = that length, or its ``client_max_tokens`` where the mix or the tenant
sets one, which cuts a longer answer (a truncation: finish reason ``length``). The simulator
stops an answer at its own length (``RequestPlan.answer_tokens``, sent as the vLLM extension field
``vllm_xargs.fleetscope_answer_tokens``, which vLLM accepts and ignores); real engines run to
``max_tokens`` (``ignore_eos``).

Prompts are token-id lists (the OpenAI completions API accepts them), so prompt lengths are
exact whatever the tokenizer; shared prefixes are fixed "system prompt" token runs, which is
what the engines' prefix cache sees in real traffic.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from common.yamlfile import YamlConfigError, describe_validation_error, read_yaml
from fleet.chain import REPEAT_IDS, successor_chain

__all__ = [
    "ANSWER_TOKENS_ARG",
    "LengthDist",
    "RequestPlan",
    "SCENARIOS_DIR",
    "Scenario",
    "TrafficMix",
    "edit_prompt",
    "load_scenario",
    "next_gap",
    "plan_request",
    "rate_at",
    "unserved",
]

SCENARIOS_DIR = Path(__file__).resolve().parent / "scenarios"
TOKEN_ID_RANGE = (3, 999)  # inclusive; below the tiny models' vocabulary size, above special tokens
EDIT_RESTART_TOKENS = 4  # a predictable prompt ends with this many first tokens of its document
# the request body's vllm_xargs key that carries the answer's own length to the simulator
ANSWER_TOKENS_ARG = "fleetscope_answer_tokens"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LengthDist(_Strict):
    """A token-length distribution: log-normal (default), uniform or fixed, clipped to [min, max]."""

    dist: Literal["lognormal", "uniform", "fixed"] = "lognormal"
    median: float = Field(gt=0)
    sigma: float = Field(default=0.5, ge=0, description="log-space standard deviation (lognormal)")
    min: int = Field(default=1, ge=1)
    max: int = Field(default=4096, ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> LengthDist:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self

    def sample(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            value = self.median
        elif self.dist == "uniform":
            value = rng.uniform(self.min, self.max)
        else:
            value = rng.lognormvariate(math.log(self.median), self.sigma)
        return int(min(self.max, max(self.min, round(value))))


class Burst(_Strict):
    every_s: float = Field(gt=0)
    length_s: float = Field(gt=0)
    factor: float = Field(gt=0, description="rate multiplier during a burst")
    offset_s: float = Field(default=0, ge=0, description="when the first burst begins (0: with the traffic)")


class Diurnal(_Strict):
    period_s: float = Field(default=86400, gt=0)
    amplitude: float = Field(default=0.5, ge=0, le=1)
    peak_at_s: float = Field(default=0, ge=0)


class TenantMix(_Strict):
    name: str = Field(min_length=1)
    weight: float = Field(gt=0)
    # optional per-tenant overrides of the mix
    prompt_tokens: LengthDist | None = None
    output_tokens: LengthDist | None = None
    long_context_share: float | None = Field(default=None, ge=0, le=1)
    models: dict[str, float] | None = None
    draft_acceptance: float | None = Field(default=None, ge=0, le=1)
    client_max_tokens: int | None = Field(
        default=None, ge=1, description="the max_tokens this tenant's client sends (an answer longer is cut)"
    )


class TrafficMix(_Strict):
    rate: float = Field(gt=0, description="mean requests per second (Poisson)")
    burst: Burst | None = None
    diurnal: Diurnal | None = None
    tenants: list[TenantMix] = Field(min_length=1)
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    long_context_share: float = Field(default=0.0, ge=0, le=1)
    long_prompt_tokens: LengthDist = LengthDist(median=1200, sigma=0.15, min=800, max=1700)
    long_output_tokens: LengthDist | None = None
    shared_prefix_share: float = Field(default=0.0, ge=0, le=1)
    shared_prefix_tokens: int = Field(default=128, ge=1)
    system_prompts: int = Field(default=4, ge=1)
    models: dict[str, float] = Field(min_length=1, description="model -> weight")
    stream_share: float = Field(default=0.5, ge=0, le=1)
    # the generator's own cap on requests outstanding (arrivals past it are not sent); null: open
    # loop, every arrival sent whatever the answers (the overload scenario: the offered load exceeds
    # what the fleet holds)
    max_in_flight: int | None = Field(default=128, ge=1)
    # how predictable the text is to a speculative draft: the share of "predictable" requests, whose
    # prompts are edits of the repeat model's chain (plan_request): n-gram drafts are accepted on
    # those, hardly on others (real engines; the simulator reads it off the prompt the same way,
    # fleet.sim.engine.prompt_acceptance); not set: none
    draft_acceptance: float | None = Field(default=None, ge=0, le=1)
    # the max_tokens the clients send: an answer longer than it is cut there (finish reason
    # "length", a truncation); not set: each request asks for exactly its answer's length
    client_max_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _weights(self) -> TrafficMix:
        for where, weights in [("models", self.models)] + [
            (f"tenant {t.name} models", t.models) for t in self.tenants if t.models
        ]:
            if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
                raise ValueError(f"{where}: weights must be >= 0 with a positive sum")
        return self


class Phase(_Strict):
    at_s: float = Field(ge=0)
    name: str
    set: dict[str, Any] = Field(default_factory=dict, description="mix keys to change from here on")


class Event(_Strict):
    at_s: float = Field(ge=0)
    # stall_replica / resume_replica: a simulated replica's engine freezes with its requests
    # running (the simulator's test hook, as a wedged worker would), then goes on
    action: Literal["kill_replica", "restart_replica", "stall_replica", "resume_replica"]
    replica: str


class Scenario(_Strict):
    name: str
    description: str = ""
    # the fleet spec it plays on when it needs more than fleet.yaml (adapters, a speculative
    # replica): `fleet simulate` and `fleet traffic` use it where no --spec is given
    fleet: str | None = None
    # turn the fleet spec's autoscaling (its `autoscale:` section) on or off for this scenario;
    # unset: as the spec says (`fleet simulate --autoscale/--no-autoscale` overrides both)
    autoscale: bool | None = None
    # turn the gateway's admission by queue time (`gateway.queue_time.enabled`) on or off while it
    # plays under `fleetscope up`; unset: as the spec says
    queue_time: bool | None = None
    duration_s: float = Field(gt=0)
    mix: TrafficMix
    phases: list[Phase] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)

    _timeline: list[tuple[float, str, TrafficMix]] | None = PrivateAttr(default=None)

    def mixes(self) -> list[tuple[float, str, TrafficMix]]:
        """(start time, phase name, mix) for the base mix and every phase, in time order."""
        if self._timeline is not None:
            return self._timeline
        out = [(0.0, "start", self.mix)]
        data = self.mix.model_dump()
        for phase in sorted(self.phases, key=lambda p: p.at_s):
            data = _deep_merge(data, phase.set)
            out.append((phase.at_s, phase.name, TrafficMix.model_validate(data)))
        self._timeline = out
        return out

    def mix_at(self, t: float) -> tuple[str, TrafficMix]:
        name, mix = "start", self.mix
        for start, phase_name, phase_mix in self.mixes():
            if start <= t:
                name, mix = phase_name, phase_mix
        return name, mix


def _deep_merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key not in {"models"}:
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def unserved(scenario: Scenario, served: set[str], auto_model: str | None = None) -> list[str]:
    """The models (and LoRA adapters) ``scenario`` asks for that nothing in ``served`` serves
    (``auto_model``: the name the gateway's model router answers)."""
    wanted = {m for _t, _n, mix in scenario.mixes() for m in mix.models}
    wanted |= {m for _t, _n, mix in scenario.mixes() for t in mix.tenants for m in (t.models or {})}
    return sorted(wanted - served - ({auto_model} if auto_model else set()))


def load_scenario(name_or_path: str) -> Scenario:
    """A shipped scenario by name (``steady``) or a YAML file; ``YamlConfigError`` if bad."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = SCENARIOS_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            known = ", ".join(sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml")))
            raise YamlConfigError(f"unknown scenario {name_or_path!r}: shipped ones are {known}, or give a file")
    data, lines = read_yaml(path, "scenario file")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise YamlConfigError(describe_validation_error(exc, Scenario, str(path), lines)) from None
    data = scenario.mix.model_dump()
    for index, phase in sorted(enumerate(scenario.phases), key=lambda item: item[1].at_s):
        data = _deep_merge(data, phase.set)
        try:
            TrafficMix.model_validate(data)
        except ValidationError as exc:
            line = lines.get(("phases", str(index)))
            where = (
                f"{path}:{line} (phase {phase.name!r}, key set" if line else f"{path} (phase {phase.name!r}, key set"
            )
            raise YamlConfigError(describe_validation_error(exc, TrafficMix, where + ")", {})) from None
    scenario.mixes()
    return scenario


# --------------------------------------------------------------------------- arrivals


def rate_at(mix: TrafficMix, t: float) -> float:
    """Requests per second at scenario time ``t``: base rate x diurnal shape x burst factor."""
    rate = mix.rate
    if mix.diurnal is not None:
        d = mix.diurnal
        rate *= 1 + d.amplitude * math.cos(2 * math.pi * (t - d.peak_at_s) / d.period_s)
    if (
        mix.burst is not None
        and t >= mix.burst.offset_s
        and (t - mix.burst.offset_s) % mix.burst.every_s < mix.burst.length_s
    ):
        rate *= mix.burst.factor
    return max(rate, 1e-9)


def next_gap(mix: TrafficMix, t: float, rng: random.Random) -> float:
    """Seconds to the next arrival of a Poisson process at the current rate."""
    return rng.expovariate(rate_at(mix, t))


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class RequestPlan:
    tenant: str
    model: str
    prompt: list[int]
    max_tokens: int  # what the client asks for
    stream: bool
    long_context: bool
    shared_prefix: bool
    predictable: bool = False  # the prompt after any system prompt is an edit of the chain
    # the answer's own length (the simulated model stops there, finish reason "stop", when
    # max_tokens allows; 0: unknown, the answer runs to max_tokens as with ignore_eos)
    answer_tokens: int = 0

    @property
    def truncated(self) -> bool:
        """The client's max_tokens is below the answer's own length: the answer will be cut."""
        return 0 < self.max_tokens < self.answer_tokens


def _weighted(rng: random.Random, weights: dict[str, float]) -> str:
    names = list(weights)
    return rng.choices(names, weights=[weights[n] for n in names])[0]


def system_prompt(index: int, length: int) -> list[int]:
    """The fixed token run of shared system prompt ``index`` (same for every request)."""
    gen = random.Random(1_000_003 * (index + 1))
    return [gen.randint(*TOKEN_ID_RANGE) for _ in range(length)]


def edit_prompt(start: int, length: int) -> list[int]:
    """A predictable prompt of ``length`` tokens: a "document" that follows the repeat model's
    chain from ``start`` (``fleet.model.successor_chain``), then its first tokens again, as an
    edit request that starts the rewrite. The repeat model's greedy continuation is the rest of
    the document, which an n-gram drafter finds in the prompt."""
    if length <= 1:
        return [start][:length]
    restart = min(EDIT_RESTART_TOKENS, length // 2)
    document = [start] + successor_chain(start, length - restart - 1)
    return document + document[:restart]


def plan_request(mix: TrafficMix, rng: random.Random, max_model_len: dict[str, int] | None = None) -> RequestPlan:
    """Draw one request from the mix. Prompt + output fit the model's max length when known.
    Where the tenant or the mix sets ``draft_acceptance``, that share of the requests is
    predictable: the prompt after any system prompt is an ``edit_prompt``."""
    tenant = rng.choices(mix.tenants, weights=[t.weight for t in mix.tenants])[0]
    model = _weighted(rng, tenant.models or mix.models)
    long_share = tenant.long_context_share if tenant.long_context_share is not None else mix.long_context_share
    long_context = rng.random() < long_share
    if long_context:
        prompt_len = mix.long_prompt_tokens.sample(rng)
        max_tokens = (mix.long_output_tokens or tenant.output_tokens or mix.output_tokens).sample(rng)
    else:
        prompt_len = (tenant.prompt_tokens or mix.prompt_tokens).sample(rng)
        max_tokens = (tenant.output_tokens or mix.output_tokens).sample(rng)
    limit = (max_model_len or {}).get(model)
    if limit is not None and prompt_len + max_tokens > limit:
        max_tokens = max(1, min(max_tokens, limit // 4))
        prompt_len = max(1, min(prompt_len, limit - max_tokens))
    shared = rng.random() < mix.shared_prefix_share
    if shared:  # system prompt + at least a short user turn, within the model's limit
        prompt_len = max(prompt_len, mix.shared_prefix_tokens + 16)
        if limit is not None and prompt_len + max_tokens > limit:
            shared = False
            prompt_len = max(1, limit - max_tokens)
    prompt: list[int] = []
    if shared:
        prompt = system_prompt(rng.randrange(mix.system_prompts), mix.shared_prefix_tokens)
    acceptance = tenant.draft_acceptance if tenant.draft_acceptance is not None else mix.draft_acceptance
    predictable = acceptance is not None and rng.random() < acceptance
    if predictable:
        prompt += edit_prompt(rng.choice(REPEAT_IDS), prompt_len - len(prompt))
    else:
        prompt += [rng.randint(*TOKEN_ID_RANGE) for _ in range(prompt_len - len(prompt))]
    cap = tenant.client_max_tokens if tenant.client_max_tokens is not None else mix.client_max_tokens
    return RequestPlan(
        tenant=tenant.name,
        model=model,
        prompt=prompt,
        max_tokens=min(max_tokens, cap) if cap is not None else max_tokens,
        answer_tokens=max_tokens,
        stream=rng.random() < mix.stream_share,
        long_context=long_context,
        shared_prefix=shared,
        predictable=predictable,
    )
