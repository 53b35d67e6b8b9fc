"""vLLM's metric names, once: every page, rule and query names them through here.

In:  nothing (names as vLLM 0.32 exposes them, with their units in the names; older names are
     mapped to these by the collector, ``collector.convert``).
Out: the gauges, counters and histogram families fleetscope reads, and ``LATENCIES``: each
     latency's histogram family and where the request log keeps it (the raw column, the rollup
     sketch).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CACHED_PROMPT_TOKENS",
    "CACHE_CONFIG_INFO",
    "E2E",
    "GENERATION_TOKENS",
    "ITERATION_TOKENS",
    "ITL",
    "KV_CACHE_USAGE",
    "LATENCIES",
    "LORA_INFO",
    "PREEMPTIONS",
    "PREFIX_HITS",
    "PREFIX_QUERIES",
    "PROMPT_TOKENS",
    "QUEUE",
    "REQUESTS_RUNNING",
    "REQUESTS_WAITING",
    "REQUESTS_WAITING_BY_REASON",
    "SPEC_ACCEPTED",
    "SPEC_ACCEPTED_PER_POS",
    "SPEC_DRAFTS",
    "SPEC_DRAFT_TOKENS",
    "TPOT",
    "TTFT",
    "Latency",
]

# gauges
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # 0..1, blocks used / blocks but the null block
REQUESTS_RUNNING = "vllm:num_requests_running"  # every engine reports it: present while it is up
REQUESTS_WAITING = "vllm:num_requests_waiting"
# per reason (label ``reason``; ``deferred``: held back by the LoRA budget)
REQUESTS_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
# an info gauge whose labels are the KV cache's config (``num_gpu_blocks``, ``block_size``, ...)
CACHE_CONFIG_INFO = "vllm:cache_config_info"
# counters
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"  # tokens
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"  # tokens
PROMPT_TOKENS = "vllm:prompt_tokens_total"
CACHED_PROMPT_TOKENS = "vllm:prompt_tokens_cached_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
# speculative decoding (only engines started with a speculative config report them)
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"  # draft proposals (one per request per decode step)
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"  # tokens proposed
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"  # proposed tokens the target model accepted
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label position: 0, 1, ...
# LoRA (engines started with --enable-lora): a gauge whose *value* is the time the engine last
# stepped in a state and whose labels are the state: max_lora, running_lora_adapters and
# waiting_lora_adapters (comma-joined adapter names); one series per state seen
LORA_INFO = "vllm:lora_requests_info"
# histograms (family names: the series are ``_bucket``, ``_sum``, ``_count``)
ITERATION_TOKENS = "vllm:iteration_tokens_total"  # tokens per engine step
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
QUEUE = "vllm:request_queue_time_seconds"


@dataclass(frozen=True)
class Latency:
    """A latency fleetscope shows: the engines' histogram and the request log's column for it."""

    family: str  # vLLM histogram family
    column: str  # raw request-log column, seconds
    sketch: str  # the request rollups' quantile sketch


LATENCIES = {
    "ttft": Latency(TTFT, "ttft_seconds", "ttft"),
    "itl": Latency(ITL, "itl_seconds", "itl"),
    "tpot": Latency(TPOT, "tpot_seconds", "tpot"),
    "e2e": Latency(E2E, "e2e_seconds", "e2e"),
    "queue": Latency(QUEUE, "queue_seconds", "queue"),
}
