"""The server's Prometheus metrics (``prometheus_client``, one registry per app), served at ``/metrics``.

Counters for requests (by model, version, router arm), errors by kind, feedback, tokens and server events;
histograms of request, policy and server-overhead time; gauges for requests in flight, requests waiting on
the policy (queue depth), rows waiting in the store's outage spool, stable versions and canary shares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from taskrl.deploy.store import InteractionStore

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class ServerMetrics:
    """All metrics of one app; ``render(routers, store)`` returns the exposition text and its content type."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("taskrl_requests", "Chat turns answered.", ["model", "version", "route"], registry=r)
        self.errors = Counter("taskrl_errors", "Chat requests refused or failed.", ["model", "kind"], registry=r)
        self.events = Counter(
            "taskrl_events", "Server events (shadow runs, withheld tool calls, cancellations, spooled rows).",
            ["event", "model", "version"], registry=r,
        )  # fmt: skip
        self.feedback = Counter("taskrl_feedback", "Feedback signals stored.", ["model", "version", "kind"], registry=r)
        self.tokens = Counter("taskrl_tokens", "Tokens served.", ["model", "kind"], registry=r)
        self.request_seconds = Histogram(
            "taskrl_request_seconds", "Chat request time in the server.", ["model"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.policy_seconds = Histogram(
            "taskrl_policy_seconds", "Time the policy took to sample a turn.", ["model"], buckets=LATENCY_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.overhead_seconds = Histogram(
            "taskrl_server_overhead_seconds", "Server time beyond the policy (auth, routing, logging).",
            buckets=OVERHEAD_BUCKETS, registry=r,
        )  # fmt: skip
        self.in_flight = Gauge("taskrl_requests_in_flight", "Chat requests being handled.", registry=r)
        self.queue_depth = Gauge("taskrl_generation_queue_depth", "Requests waiting on the policy.", registry=r)
        self.spool_rows = Gauge("taskrl_store_spool_rows", "Rows waiting in the outage spool.", registry=r)
        self.stable_version = Gauge("taskrl_stable_version", "Stable version per model.", ["model"], registry=r)
        self.canary_share = Gauge(
            "taskrl_canary_share", "Share of sessions on the canary.", ["model", "version"], registry=r
        )
        self.draining = Gauge("taskrl_draining", "1 while the server drains after SIGTERM.", registry=r)

    def count(self, event: str, model: str, version: Any = "") -> None:
        self.events.labels(event, model, str(version)).inc()

    def render(self, routers: dict[str, Any], store: InteractionStore | None = None) -> tuple[bytes, str]:
        self.canary_share.clear()
        for name, router in routers.items():
            self.stable_version.labels(name).set(router.stable)
            if router.candidate is not None:
                share = router.config.stages[router.stage]
                self.canary_share.labels(name, str(router.candidate)).set(share)
        spool = store.spool if store is not None else None
        self.spool_rows.set(spool.rows if spool is not None else 0)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
