"""Quality signals of the bundled fleet's answers: the evaluators (``fleet.quality.evaluators``)
that score one answer's text, pure and without I/O; the gateway samples answers and calls them."""

from fleet.quality.evaluators import DEFAULT_REFUSALS, Scores, evaluate

__all__ = ["DEFAULT_REFUSALS", "Scores", "evaluate"]
