"""Gateway settings: the ``gateway`` section of the fleet spec -> ``GatewaySpec``.

Which gateway (``kind``: fleetscope's own, or LiteLLM, vllm-router or Envoy run by
``fleet.gateways``), routing policy, model router rules, per-tenant admission limits, the bounded queue, health
checks, where the request log goes (the collector's ``POST /v1/requests``), and which answers are
sampled and scored (``quality``: ``QualitySpec``, docs/quality.md), and the model router's audit
(``router_audit``: ``AuditSpec``, with an optional judge ``JudgeSpec``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleet.quality.evaluators import DEFAULT_REFUSALS, compile_patterns

__all__ = [
    "DEFAULT_RUBRIC",
    "AuditSpec",
    "GatewaySpec",
    "JudgeSpec",
    "ModelRouterSpec",
    "QualitySpec",
    "QueueTimeSpec",
    "TenantLimits",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelRouterSpec(_Strict):
    """Sends "easy" requests to the small model and "hard" ones to the large model."""

    small_model: str
    large_model: str
    long_prompt_tokens: int = Field(default=1024, ge=1, description="prompts longer than this are hard")
    high_max_tokens: int = Field(default=512, ge=1, description="max_tokens above this is hard")
    large_tenants: list[str] = Field(default_factory=list, description="tenants always sent to the large model")


class TenantLimits(_Strict):
    requests_per_s: float | None = Field(default=None, gt=0)
    tokens_per_s: float | None = Field(default=None, gt=0, description="prompt + max_tokens per second")
    burst_s: float = Field(default=2.0, gt=0, description="bucket size in seconds of rate")
    weight: float = Field(default=1.0, gt=0, description="the tenant's share of a busy pool, against the others'")
    priority: int = Field(
        default=0, ge=-9, le=9, description="each step widens (below 0: narrows) its queue-time budget by half"
    )


class QueueTimeSpec(_Strict):
    """Admission by queue time (fleet.gateway.queue_time): a request whose estimated wait for its
    first token is past its pool's budget (the model's SLO TTFT target x budget_factor) gets 429.
    Off unless asked for (here, or by a scenario under `fleetscope up`): a budget from a target
    that does not fit the fleet sheds requests the fleet could have served in time."""

    enabled: bool = False
    budget_factor: float = Field(default=1.0, gt=0, description="the budget: the model's SLO ttft times this")
    default_budget_s: float | None = Field(
        default=None, gt=0, description="the budget of a model without an SLO ttft target (none: not shed)"
    )
    window_s: float = Field(default=30.0, gt=0, description="the pool's pace: its first tokens over this window")
    min_events: int = Field(default=5, ge=1, description="fewer first tokens in the window: no estimate, admitted")
    fair_share_at: float = Field(
        default=0.5, gt=0, le=1, description="past this share of the budget, a tenant over its share is shed"
    )


class QualitySpec(_Strict):
    """Sampled answers scored by the evaluators (``fleet.quality``); by default no text is kept."""

    sample_rate: float = Field(default=0.05, ge=0, le=1, description="share of requests whose answer is scored")
    refusal_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_REFUSALS),
        description="regular expressions (case-insensitive) that mark a refusal; replaces the default list",
    )
    keep_text: bool = Field(default=False, description="keep the sampled answer's text (redacted) in the record")
    redact: list[str] = Field(
        default_factory=list, description="regular expressions replaced by [redacted] in a kept text"
    )
    max_chars: int = Field(default=65536, ge=1, le=1_048_576, description="the most text captured per answer")

    @field_validator("refusal_patterns")
    @classmethod
    def _refusals_compile(cls, value: list[str]) -> list[str]:
        compile_patterns(value, "refusal pattern")
        return value

    @field_validator("redact")
    @classmethod
    def _redactions_compile(cls, value: list[str]) -> list[str]:
        compile_patterns(value, "redact pattern", flags=0)
        return value


Direction = Literal["small_to_large", "large_to_small"]
DIRECTIONS: tuple[Direction, ...] = ("small_to_large", "large_to_small")
DEFAULT_RUBRIC = (
    "You grade an assistant's answer to a user's request. Score how well the answer serves the "
    "request: 1 useless or wrong, 2 poor, 3 acceptable, 4 good, 5 excellent. Reply with the score only."
)


class JudgeSpec(_Strict):
    """An LLM that grades answers: an OpenAI-compatible ``/v1/chat/completions`` endpoint."""

    url: str | None = Field(
        default=None,
        description="the endpoint's base URL (an outside judge); none: a replica of the fleet serving `model`, "
        "chosen by the gateway's router",
    )
    model: str = Field(description="the model name to ask for")
    api_key: str | None = Field(default=None, description="sent as a Bearer token when set")
    rubric: str = Field(default=DEFAULT_RUBRIC, min_length=1, description="the instructions; asks for a 1-5 score")
    # the router audit grades its two answers together, so a budget is spent in pairs: at least 2
    max_calls_per_minute: int = Field(default=30, ge=2, description="the budget: judge calls in any 60 s")
    max_calls: int | None = Field(default=None, ge=2, description="the most judge calls in the gateway's life")
    timeout_s: float = Field(default=20.0, gt=0, description="one judge call; beyond: not judged")
    max_answer_chars: int = Field(default=4000, ge=100, description="of each answer shown to the judge")
    constrained: bool = Field(
        default=False,
        description="ask vLLM's structured outputs for one of the scores 1-5 (vLLM endpoints only)",
    )


class AuditSpec(_Strict):
    """The model router audited: a sample of its decisions replayed in shadow on the other model."""

    enabled: bool = False
    sample_rate: float = Field(default=0.05, ge=0, le=1, description="share of the router's decisions replayed")
    max_share: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="shadow tokens at most this share of the tokens the gateway served users in the last window_s",
    )
    window_s: float = Field(default=60.0, gt=0)
    directions: list[Direction] = Field(
        default_factory=lambda: list(DIRECTIONS),
        description="which decisions are replayed: sent small, replayed large; sent large, replayed small",
    )
    tenant: str = Field(default="router-audit", min_length=1, description="the tenant shadow requests are billed to")
    timeout_s: float = Field(default=120.0, gt=0, description="a shadow request; beyond: given up")
    judge: JudgeSpec | None = None


class GatewaySpec(_Strict):
    enabled: bool = True
    # which gateway: fleetscope's own (this module), or a third-party one the launcher runs in its
    # place (fleet/gateways: LiteLLM, vllm-router, Envoy), its telemetry pointed at the collector
    kind: Literal["fleetscope", "litellm", "vllm-router", "envoy"] = "fleetscope"
    port: int = Field(default=8100, ge=1024, le=65535)
    metrics_port: int | None = Field(
        default=None,
        ge=1024,
        le=65535,
        description="vllm-router's Prometheus port and Envoy's admin port (default: port + 10000)",
    )
    litellm_master_key: str = Field(
        default="sk-fleetscope-local",
        min_length=8,
        description="the key LiteLLM's proxy asks of every client (it listens on the fleet's host only)",
    )
    # how a replica is chosen among those serving the (routed) model
    policy: Literal["round_robin", "least_loaded", "affinity"] = "least_loaded"
    model_router: ModelRouterSpec | None = None
    auto_model: str = Field(default="auto", description="the model name that asks for the model router")
    affinity_prefix_tokens: int = Field(default=64, ge=1, description="prompt prefix hashed for affinity and the log")
    default_limits: TenantLimits = TenantLimits()
    tenant_limits: dict[str, TenantLimits] = Field(default_factory=dict)
    queue_time: QueueTimeSpec = QueueTimeSpec()
    max_in_flight: int = Field(default=64, ge=1, description="requests forwarded at once")
    max_queue: int = Field(default=128, ge=0, description="requests waiting for a slot; beyond: 429")
    queue_timeout_s: float = Field(default=30.0, gt=0)
    upstream_timeout_s: float = Field(default=300.0, gt=0, description="the whole answer of a replica; beyond: 504")
    upstream_first_byte_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="the replica's first byte (a streamed answer's first event, a non-streamed "
        "answer whole), and the longest silence inside a streamed answer; beyond: 504 (a wedged engine frees its "
        "slots)",
    )
    health_interval_s: float = Field(default=2.0, gt=0)
    request_log_url: str | None = Field(default="http://127.0.0.1:4318/v1/requests")
    request_log_flush_s: float = Field(default=1.0, gt=0)
    request_log_max_buffer: int = Field(default=100_000, ge=1)
    quality: QualitySpec = QualitySpec()
    router_audit: AuditSpec = AuditSpec()

    def metrics_port_or_default(self) -> int:
        return self.metrics_port if self.metrics_port is not None else self.port + 10000
