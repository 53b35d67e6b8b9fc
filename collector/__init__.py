"""Collector: targets -> scrapes -> exposition parser -> writer -> ClickHouse; OTLP spans and
gateway request logs -> sampled request rows -> writer. May import ``storage``.
"""
