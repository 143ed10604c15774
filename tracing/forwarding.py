"""Spans sent on to an OpenTelemetry collector, by OpenTelemetry's own exporters.

`AGENTSITE_OTLP_ENDPOINT` set, each process gets one `Forwarding`: OpenTelemetry's
`BatchSpanProcessor` around its OTLP/HTTP span exporter, `http/protobuf` (the default of the
OpenTelemetry exporters, and what receivers such as Arize Phoenix take) or `http/json`
(`AGENTSITE_OTLP_PROTOCOL`). The exporters' requests, retries (exponential, honouring
Retry-After, within `AGENTSITE_OTLP_TIMEOUT`) and encoding are OpenTelemetry's; the site adds:

- `CheckedTransport`, the exporters' HTTP: through `common.outbound`'s opener, so a span goes
  only to an address the deployment allows (checked on the resolved address at each
  connection), never through a proxy named in the environment, and a redirect is a refusal;
- `Forwarder`, around the exporter: a failure is logged once per burst (a warning with the
  endpoint, never its credentials), then quietly until a batch is delivered again; and while
  failing, batches are dropped at once for 1 s after the first failure, doubling up to a
  minute, before one probe. An unreachable collector would otherwise hold the processor's
  thread for the whole timeout of every batch while its queue filled.

What is handed to it is already masked (`exporter.OtlpExporter`, `recording.record_decision`)
and `ReadableSpan`s (`tracing.otlp`). Handing never blocks: the processor's queue is bounded
(`AGENTSITE_TRACE_QUEUE_SIZE`, the newest dropped when full), its thread sends.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from opentelemetry.exporter.http.transport._base import BaseHTTPResult, BaseHTTPTransport
from opentelemetry.exporter.otlp.json.http.trace_exporter import (
    OTLPSpanExporter as JsonSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as ProtobufSpanExporter,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from common import destinations, outbound

logger = logging.getLogger(__name__)

PROTOCOLS = ("http/protobuf", "http/json")
# While the endpoint fails, batches are dropped without a request for this long, doubling.
PAUSE_FIRST = 1.0
PAUSE_MOST = 60.0
ANSWER_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Answer(BaseHTTPResult):
    """What one request got: a status (and its body and headers), or the error."""

    body: bytes = b""
    header_map: Mapping[str, str] = field(default_factory=dict)

    def content(self) -> bytes:
        return self.body

    def headers(self) -> Mapping[str, str]:
        return self.header_map

    @property
    def said(self) -> str:
        if self.error is not None:
            return _reason(self.error)
        return f"HTTP {self.status_code} {self.reason or ''}".strip()


class CheckedTransport(BaseHTTPTransport):
    """OpenTelemetry's exporters' HTTP, through the site's checked opener (no proxy from the
    environment, the resolved address checked, no redirect). A refused address is not worth
    retrying; at shutdown (`stopping`) nothing is."""

    def __init__(self) -> None:
        self.stopping = False
        self.last: Answer | None = None

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        data: bytes | None = None,
    ) -> BaseHTTPResult:
        self.last = self._request(method, url, headers or {}, timeout, data)
        return self.last

    def _request(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        timeout: float | None,
        data: bytes | None,
    ) -> Answer:
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with outbound.opener.open(request, timeout=timeout) as response:
                return Answer(
                    status_code=response.status,
                    reason=response.reason,
                    body=response.read(ANSWER_BYTES),
                    header_map=_headers(response.headers),
                )
        except urllib.error.HTTPError as refused:
            if 300 <= refused.code < 400:
                # OpenTelemetry's client counts any answer below 400 as delivered.
                return Answer(error=RuntimeError(f"HTTP {refused.code}: a redirect, not followed"))
            if self.stopping:
                return Answer(error=RuntimeError(outbound.refusal(refused, 300)))
            return Answer(
                status_code=refused.code,
                reason=outbound.refusal(refused, 300),
                header_map=_headers(refused.headers),
            )
        except (OSError, ValueError) as failed:
            return Answer(error=failed)

    def is_connection_error(self, exception: Exception | None) -> bool:
        if self.stopping or exception is None:
            return False
        refused = getattr(exception, "reason", exception)
        return isinstance(exception, OSError) and not isinstance(
            refused, destinations.DestinationRefused
        )

    def close(self) -> None:
        return None


def _headers(message: Any) -> Mapping[str, str]:
    """An answer's headers, keyed in lower case (the exporter reads `retry-after`)."""
    return {str(key).lower(): str(value) for key, value in message.items()}


def _reason(error: BaseException) -> str:
    reason = getattr(error, "reason", None)
    if isinstance(error, urllib.error.URLError) and reason is not None:
        return f"could not connect: {reason}"
    return f"{type(error).__name__}: {error}" if not isinstance(error, RuntimeError) else str(error)


class Forwarder(SpanExporter):
    """An OTLP span exporter that pauses while its endpoint fails, and says so once."""

    def __init__(
        self,
        exporter: SpanExporter,
        transport: CheckedTransport,
        endpoint: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.exporter = exporter
        self.transport = transport
        self.shown = shown_endpoint(endpoint)
        self.delivered = 0
        self.lost = 0
        self._clock = clock
        self._failing = False
        self._pause = 0.0
        self._paused_until = 0.0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            if self._failing and self._clock() < self._paused_until:
                self.lost += 1
                logger.debug("OpenTelemetry: a batch of spans was dropped (%s failing)", self.shown)
                return SpanExportResult.FAILURE
            self.transport.last = None
            try:
                result = self.exporter.export(spans)
            except Exception as exc:  # never into the processor's thread
                result = SpanExportResult.FAILURE
                self.transport.last = Answer(error=exc)
            if result is SpanExportResult.SUCCESS:
                self._recovered()
            else:
                self._failed(self.transport.last)
            return result

    def _failed(self, answer: Answer | None) -> None:
        self.lost += 1
        self._pause = min(PAUSE_MOST, max(PAUSE_FIRST, self._pause * 2))
        self._paused_until = self._clock() + self._pause
        said = answer.said if answer is not None else "the request could not be made"
        if self._failing:
            logger.debug("OpenTelemetry: a batch of spans was not delivered: %s", said)
            return
        self._failing = True
        logger.warning(
            "[non-fatal] OpenTelemetry: spans were not delivered to %s (%s); "
            "further failures are not logged until a delivery succeeds",
            self.shown,
            said,
        )

    def _recovered(self) -> None:
        self.delivered += 1
        self._pause = 0.0
        if self._failing:
            self._failing = False
            logger.warning(
                "OpenTelemetry: spans reach %s again (%d batch(es) lost so far)",
                self.shown,
                self.lost,
            )

    def shutdown(self) -> None:
        self.transport.stopping = True
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def span_exporter(
    endpoint: str,
    headers: Mapping[str, str] | None = None,
    *,
    timeout: float = 10.0,
    protocol: str = "http/protobuf",
    clock: Callable[[], float] = time.monotonic,
) -> Forwarder:
    """OpenTelemetry's OTLP/HTTP span exporter for `protocol`, on the checked transport."""
    transport = CheckedTransport()
    exporter_class = JsonSpanExporter if protocol == "http/json" else ProtobufSpanExporter
    exporter = exporter_class(
        endpoint=endpoint, headers=dict(headers or {}), timeout=timeout, _transport=transport
    )
    return Forwarder(exporter, transport, endpoint, clock=clock)


class Forwarding:
    """One process's way out: a `Forwarder` behind OpenTelemetry's `BatchSpanProcessor`."""

    def __init__(self, forwarder: Forwarder, *, queue: int, delay: float, batch: int) -> None:
        self.forwarder = forwarder
        self.processor = BatchSpanProcessor(
            forwarder,
            max_queue_size=queue,
            schedule_delay_millis=max(1.0, delay * 1000),
            max_export_batch_size=min(batch, queue),
            export_timeout_millis=30_000,
        )

    def hand(self, spans: Iterable[ReadableSpan]) -> None:
        """Queue `spans` to be sent (never blocks; the newest are dropped when it is full)."""
        for span in spans:
            self.processor.on_end(span)

    def flush(self, timeout: float) -> bool:
        return self.processor.force_flush(int(timeout * 1000))

    def stop(self, timeout: float = 2.0) -> None:
        """At exit: what is queued is tried once (no retries), within `timeout`."""
        self.forwarder.transport.stopping = True
        self.flush(timeout)

    def shutdown(self) -> None:
        self.forwarder.transport.stopping = True  # before the queue's last export: no retries
        self.processor.shutdown()


_forwarding: Forwarding | None = None
_lock = threading.Lock()


def from_settings() -> Forwarding | None:
    """This process's `Forwarding` (made once), or None when `AGENTSITE_OTLP_ENDPOINT` is
    unset."""
    global _forwarding
    endpoint = settings.AGENTSITE_OTLP_ENDPOINT
    if not endpoint:
        return None
    with _lock:
        if _forwarding is None:
            forwarder = span_exporter(
                endpoint,
                settings.AGENTSITE_OTLP_HEADERS,
                timeout=settings.AGENTSITE_OTLP_TIMEOUT,
                protocol=settings.AGENTSITE_OTLP_PROTOCOL,
            )
            _forwarding = Forwarding(
                forwarder,
                queue=settings.AGENTSITE_TRACE_QUEUE_SIZE,
                delay=settings.AGENTSITE_TRACE_BATCH_DELAY,
                batch=512,
            )
            atexit.register(_forwarding.stop)
        return _forwarding


def current() -> Forwarding | None:
    """The `Forwarding` made so far in this process, if any."""
    return _forwarding


def reset() -> None:
    """Forget this process's `Forwarding` (its queue shut down): the next `from_settings`
    makes one from the settings as they are then (tests, a changed endpoint)."""
    global _forwarding
    with _lock:
        if _forwarding is not None:
            _forwarding.shutdown()
            atexit.unregister(_forwarding.stop)
        _forwarding = None


def shown_endpoint(endpoint: str) -> str:
    """The endpoint as logs show it: no user or password, no query (a token may be there)."""
    parts = urllib.parse.urlsplit(endpoint)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))
