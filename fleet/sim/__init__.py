"""The vLLM engine simulator: ``engine`` (the scheduling/KV-cache model), ``metrics`` (vLLM's
exposition), ``server`` (many simulated engines on their own ports in one process).
``python -m fleet.sim`` runs the ``engine: sim`` replicas of a spec, or N generated ones."""
