"""The Redis client a limiter talks to, and the error it raises when Redis does not answer.

A limiter gets a ``redis.Redis`` or a ``redis://host:port/db`` URL; from a URL it
builds a client with short socket timeouts and no retries (a retried script that
had in fact run would charge twice). ``redis`` is imported inside the functions,
so importing this module needs only the standard library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis

__all__ = ["DEFAULT_TIMEOUT_S", "LimiterUnavailableError", "address", "connect"]

DEFAULT_TIMEOUT_S = 0.25


class LimiterUnavailableError(ConnectionError):
    """Redis did not answer: the limiter cannot decide (fail closed: refuse the request)."""


def address(client: redis.Redis) -> str:
    """The server a client talks to, as ``host:port`` or ``unix:path``, for error messages."""
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def connect(client: redis.Redis | str, timeout_s: float) -> redis.Redis:
    """``client`` itself, or a new client for a ``redis://`` URL with short timeouts, no retries."""
    import redis as redis_py
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    if isinstance(client, str):
        return redis_py.Redis.from_url(
            client,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
    return client
