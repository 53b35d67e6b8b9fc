"""fleetscope's numbers as Prometheus metrics: analytics' figures, refreshed in the background,
served on the collector's ``GET /metrics`` (docs/prometheus.md)."""
