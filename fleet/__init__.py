"""The bundled fleet that fleetscope observes: fleet spec, tiny-model generator, vLLM engine
launcher, engine simulator, gateway, traffic generator and incident scenarios.

It imports nothing of the platform: it is the thing observed.
"""
