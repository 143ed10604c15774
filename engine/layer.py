"""The Redis channel layer, made to live through a Redis outage (settings use it with REDIS_URL).

channels_redis keeps one connection pool per event loop for the life of the process and never
drops a connection that broke: after Redis was stopped and started again, the first calls of
the server went out on connections Redis had closed, failed, and a socket's `connect` failed
with them (daphne answered the handshake with a bare 500). And a layer call had no time
limit: a Redis that does not answer held a request, a run or a handshake forever (the socket
got no valid HTTP response at all).

So here:

- every call that is not a receive has `CALL_SECONDS` to finish, and each connection its
  connect and read time-outs;
- a call that fails on a broken connection drops the pool's idle connections (the ones Redis
  closed with it) and is tried once more, on a fresh connection (if that fails too, the
  error is the caller's: `engine.access` pauses the socket, `engine.events` drops the event);
- every break is told to the listeners `on_break` registered (`engine.access` closes the open
  sockets with 4503: Redis may have restarted empty, forgetting their groups, so their pages
  reconnect, join again and re-read the database meanwhile), and logged once per outage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels_redis.core import RedisChannelLayer
from channels_redis.utils import create_pool
from redis import exceptions as redis_errors

logger = logging.getLogger(__name__)

# What a broken or unreachable Redis raises (OSError covers a refused connection).
BROKEN = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError, TimeoutError)
TIMED_OUT = (redis_errors.TimeoutError, TimeoutError)

# How long a send, group_add, group_discard or group_send may take, in seconds.
CALL_SECONDS = 2.0
CONNECT_SECONDS = 2.0

_listeners: list[Callable[[], None]] = []


def on_break(listener: Callable[[], None]) -> None:
    """Call `listener()` (on the loop that saw it) whenever a connection to Redis breaks."""
    if listener not in _listeners:
        _listeners.append(listener)


class ChannelLayer(RedisChannelLayer):
    """`channels_redis`' layer, with time limits, fresh connections after a break, and the
    break told (see the module's docstring)."""

    down = False

    def create_pool(self, index: int) -> Any:
        host = dict(self.hosts[index])
        host.setdefault("socket_connect_timeout", CONNECT_SECONDS)
        # A blocking pop waits `brpop_timeout` on the server: a read may take that long.
        host.setdefault("socket_timeout", self.brpop_timeout + CALL_SECONDS)
        return create_pool(host)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        await self._call(lambda: super(ChannelLayer, self).send(channel, message))

    async def group_add(self, group: str, channel: str) -> None:
        await self._call(lambda: super(ChannelLayer, self).group_add(group, channel))

    async def group_discard(self, group: str, channel: str) -> None:
        await self._call(lambda: super(ChannelLayer, self).group_discard(group, channel))

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await self._call(lambda: super(ChannelLayer, self).group_send(group, message))

    async def receive(self, channel: str) -> dict[str, Any]:
        # No time limit: a receive waits for the next message as long as it takes.
        receive = super().receive
        message: dict[str, Any] = await self._call(lambda: receive(channel), limit=None)
        return message

    async def _call(
        self, call: Callable[[], Awaitable[Any]], limit: float | None = CALL_SECONDS
    ) -> Any:
        try:
            async with asyncio.timeout(limit):
                result = await call()
        except BROKEN as error:
            await self._broke(error)
            if isinstance(error, TIMED_OUT):
                raise  # Redis does not answer: waiting once more would only double the wait
            # Once more, on a fresh connection: the one that failed may only have been closed
            # by a Redis that is back. If Redis is still down, this fails at once.
            async with asyncio.timeout(limit):
                result = await call()
        self._answered()
        return result

    async def _broke(self, error: BaseException) -> None:
        if not self.down:
            self.down = True
            logger.warning(
                "The channel layer lost Redis (%s): live updates pause until it answers.",
                error.__class__.__name__,
            )
        await self._drop_idle_connections()
        for listener in list(_listeners):
            try:
                listener()
            except Exception:
                logger.exception("A channel-layer break listener failed")

    def _answered(self) -> None:
        if self.down:
            self.down = False
            logger.info("The channel layer reaches Redis again: live updates resume.")

    async def _drop_idle_connections(self) -> None:
        # channels_redis' own per-loop pools (`_layers`, `_connections`): it has no public way
        # to drop the connections of one pool.
        layer = self._layers.get(asyncio.get_running_loop())
        if layer is None:
            return
        for connection in list(layer._connections.values()):
            try:
                await connection.connection_pool.disconnect(inuse_connections=False)
            except Exception:
                logger.debug("Could not drop idle Redis connections", exc_info=True)
