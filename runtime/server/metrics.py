"""`/metrics`: Prometheus text with llama-server's metric names (tools/server/server-task.cpp
`server_task_result_metrics::to_metrics`), `llamacpp:` prefix, counters cumulative since start.
Speculation counters, summed over finished requests exactly as their responses report them:
- `spec_decode_num_drafts_total`: verify rounds with at least one draft;
- `spec_decode_num_draft_tokens_total`: drafted tokens (Σ `timings.draft_n`);
- `spec_decode_num_accepted_tokens_total`: accepted and emitted drafts (Σ `timings.draft_n_accepted`);
- `spec_decode_num_accepted_tokens_per_pos_total{position="i"}`: rounds that accepted at least i+1 drafts.
The throughput gauges (`prompt_tokens_seconds`, `predicted_tokens_seconds`) are llama-server's buckets
(server-common.h `server_metrics::bucket`): the requests finished since the last scrape, which resets them
(`reset_bucket`); generation counts decode steps (tokens after the first), as llama-server's rate does.
"""
from __future__ import annotations

import threading
import time


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.t_start = time.time()
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0
        self.prompt_s = 0.0
        self.predicted_tokens = 0
        self.predicted_s = 0.0
        self.predicted_steps = 0
        self.n_decode = 0
        self.n_tokens_max = 0
        self.drafts = 0
        self.drafted = 0
        self.accepted = 0
        self.accepted_per_pos: list[int] = []
        self.requests = 0
        self.prompt_bucket = [0, 0.0]     # [tokens, seconds] since the last scrape
        self.predict_bucket = [0, 0.0]    # [decode steps, seconds] since the last scrape

    def reset_bucket(self) -> None:
        with self._lock:
            self.prompt_bucket, self.predict_bucket = [0, 0.0], [0, 0.0]

    def snapshot(self) -> "Metrics":
        """A copy (its own lock and buckets): what a sleeping server reports."""
        with self._lock:
            m = Metrics()
            m.__dict__.update({k: (list(v) if isinstance(v, list) else v)
                               for k, v in self.__dict__.items() if k != "_lock"})
            return m

    def add(self, o, n_gen: int) -> None:
        """Count one finished request (an `Outcome` and its generated-token count)."""
        with self._lock:
            self.requests += 1
            self.prompt_tokens += o.n_prompt - o.n_cached
            self.prompt_tokens_cached += o.n_cached
            prompt_s = max(0.0, o.t_prompt - o.t_start) if o.t_prompt else 0.0
            predicted_s = max(0.0, o.t_last - o.t_prompt) if o.t_last else 0.0
            self.prompt_s += prompt_s
            self.predicted_tokens += n_gen
            self.predicted_steps += max(0, n_gen - 1)
            self.predicted_s += predicted_s
            self.prompt_bucket[0] += o.n_prompt - o.n_cached
            self.prompt_bucket[1] += prompt_s
            self.predict_bucket[0] += max(0, n_gen - 1)
            self.predict_bucket[1] += predicted_s
            self.n_decode += 1 + o.rounds + o.plain_rounds
            self.n_tokens_max = max(self.n_tokens_max, o.n_prompt + n_gen)
            self.drafts += o.rounds
            self.drafted += o.drafted
            self.accepted += o.accepted
            if len(self.accepted_per_pos) < len(o.accepted_at):
                self.accepted_per_pos += [0] * (len(o.accepted_at) - len(self.accepted_per_pos))
            for i, n in enumerate(o.accepted_at):
                self.accepted_per_pos[i] += n

    def render(self, processing: int, deferred: int) -> str:
        with self._lock:
            counters = [
                ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", self.prompt_tokens),
                ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
                 self.prompt_tokens_cached),
                ("prompt_seconds_total", "Total time spent processing prompts", self.prompt_s),
                ("tokens_predicted_total", "Number of generation tokens processed", self.predicted_tokens),
                ("tokens_predicted_seconds_total", "Total time spent generating tokens", self.predicted_s),
                ("n_decode_total", "Total number of trunk passes (prefill and verify)", self.n_decode),
                ("n_tokens_max", "Largest observed sequence length (prompt + generation)", self.n_tokens_max),
                ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", self.drafted),
                ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model",
                 self.accepted),
                ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps",
                 self.drafts),
                ("requests_total", "Number of finished requests", self.requests),
            ]
            gauges = [
                ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
                 self.prompt_bucket[0] / self.prompt_bucket[1] if self.prompt_bucket[1] > 0 else 0.0),
                ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
                 self.predict_bucket[0] / self.predict_bucket[1] if self.predict_bucket[1] > 0 else 0.0),
                ("requests_processing", "Number of requests processing", processing),
                ("requests_deferred", "Number of requests deferred", deferred),
                # every trunk pass here runs one slot's sequence (slots are stepped in turn, not batched together)
                ("n_busy_slots_per_decode", "Average number of busy slots per trunk pass (1: one slot per pass)",
                 1.0 if self.n_decode else 0.0),
            ]
            lines = []
            for kind, items in (("counter", counters), ("gauge", gauges)):
                for name, help_, value in items:
                    lines += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {kind}",
                              f"llamacpp:{name} {value}"]
            if self.accepted_per_pos:
                name = "spec_decode_num_accepted_tokens_per_pos_total"
                lines += [f"# HELP llamacpp:{name} Accepted tokens per draft position", f"# TYPE llamacpp:{name} counter"]
                lines += [f'llamacpp:{name}{{position="{i}"}} {n}' for i, n in enumerate(self.accepted_per_pos)]
            return "\n".join(lines) + "\n"
