"""Analytics: the numbers every dashboard page and alert rule shares (latency percentiles,
saturation, cost, drift, SLOs, explain). SQL runs in ClickHouse. May import ``storage``.
"""
