"""The analytics' configuration: how tokens share the GPU spend (``cost``), and the hosted-API
prices to compare the fleet's cost per token with.

In:  the ``cost`` section of ``fleetscope.yaml`` (``fleetscope.settings`` composes it).
Out: ``CostSettings`` (validated, frozen); ``weights()`` and ``references()`` for
     ``analytics.cost``.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from analytics.cost import ReferencePrice, TokenWeights
from common.config import Section

__all__ = ["CostSettings", "ReferencePriceSettings"]


class ReferencePriceSettings(Section):
    name: str = Field(min_length=1)
    input: float = Field(ge=0, description="USD per 1M input tokens")
    output: float = Field(ge=0, description="USD per 1M output tokens")
    cached: float | None = Field(default=None, ge=0, description="USD per 1M cached input tokens (default: input)")


class CostSettings(Section):
    """How tokens share the GPU spend, and the API prices to compare the fleet with."""

    input_weight: float = Field(default=1.0, ge=0, description="a computed prompt token")
    cached_weight: float = Field(default=0.25, ge=0, description="a prompt token served from the prefix cache")
    output_weight: float = Field(default=4.0, ge=0, description="an output token")
    reference_prices: list[ReferencePriceSettings] = Field(
        default_factory=lambda: [
            ReferencePriceSettings(name="gpt-4o-mini (list, 2025)", input=0.15, cached=0.075, output=0.60),
            ReferencePriceSettings(name="gpt-4o (list, 2025)", input=2.50, cached=1.25, output=10.00),
        ],
        description="USD per 1M tokens of hosted APIs to compare the cost per token with",
    )

    @model_validator(mode="after")
    def _weights(self) -> CostSettings:
        if self.input_weight + self.output_weight <= 0:
            raise ValueError("input_weight + output_weight must be > 0")
        return self

    def weights(self) -> TokenWeights:
        return TokenWeights(input=self.input_weight, cached=self.cached_weight, output=self.output_weight)

    def references(self) -> list[ReferencePrice]:
        return [ReferencePrice(r.name, r.input, r.output, r.cached) for r in self.reference_prices]
