"""LoRA adapters in the metrics, once LoRA is on: vLLM's `vllm:lora_requests_info`, which the
Gateway API Inference Extension's LoRA-affinity scorer reads (labels `max_lora`, the slots, and
`running_lora_adapters` / `waiting_lora_adapters`, comma-separated names; the value is the time
of the report, as vLLM's), and ours per adapter."""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Gauge


class LoRAMetrics:
    def __init__(self, r: CollectorRegistry) -> None:
        self.info = Gauge("vllm:lora_requests_info", "LoRA adapters of running and waiting requests "
                          "in the labels; the value is the time of the report",
                          ["max_lora", "running_lora_adapters", "waiting_lora_adapters"], registry=r)
        self.running = Gauge("radixserve_lora_running_requests", "Running requests of each LoRA adapter",
                             ["adapter"], registry=r)
        self.waiting = Gauge("radixserve_lora_waiting_requests", "Waiting requests of each LoRA adapter",
                             ["adapter"], registry=r)
        self.slots = Gauge("radixserve_lora_slots", "LoRA adapter slots on the device (--max-loras-per-batch)",
                           registry=r)

    def on_stats(self, slots: int, requests: dict[str, list[int]]) -> None:
        """`requests`: [running, waiting] of each adapter that has any."""
        running = sorted(n for n, (r, _) in requests.items() if r)
        waiting = sorted(n for n, (_, w) in requests.items() if w)
        self.info.clear()  # one sample: the labels of the latest report
        self.info.labels(str(slots), ",".join(running), ",".join(waiting)).set(time.time())
        self.slots.set(slots)
        for gauge, i in ((self.running, 0), (self.waiting, 1)):
            gauge.clear()
            for name, counts in requests.items():
                gauge.labels(name).set(counts[i])
