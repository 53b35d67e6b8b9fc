"""fleetscope: observability and cost analytics for vLLM inference fleets.

This package holds the CLI (``fleetscope.cli``), the settings (``fleetscope.settings``)
and the wiring that assembles the other packages into commands.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
