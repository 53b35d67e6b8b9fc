"""What every layer shares and nothing else: configuration loading (YAML with one-line errors,
environment overrides, the ``Section`` base the components' config models use), durations and
UTC time. Imports nothing of fleetscope."""
