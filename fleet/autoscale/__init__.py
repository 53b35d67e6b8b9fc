"""The bundled fleet's autoscaler: ``policy`` (decisions from LLM signals), ``events`` (what each
decision and each replica's start and stop leave in the store)."""
