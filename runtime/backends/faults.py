"""A service's fault as against a bug in sailrl: :func:`service_fault` tells a fault of a service, of its HTTP
transport or of the embedded backend (the Tinker and Sail SDKs' errors, httpx / aiohttp / requests errors, a refused or
dropped connection, a time-out, an out-of-memory error) from everything else, which is a bug (:func:`is_bug`)."""

from __future__ import annotations

from sailrl.spec.errors import SailrlError, ServiceError

__all__ = ["is_bug", "service_fault"]


#: The exception classes of a service's, its transport's or the embedded backend's faults, as (module, name): an
#: exception is one when a class of its hierarchy is listed. By name, so that this module imports none of those
#: libraries (a run on the embedded backend never loads the Sail SDK).
_FAULT_CLASSES = frozenset({
    ("tinker", "TinkerError"),  # the Tinker SDK: API status, connection, time-out, a request that failed
    ("tinker._exceptions", "TinkerError"),
    ("sail.errors", "SailError"),  # the Sail SDK
    ("httpx", "HTTPError"), ("httpx", "StreamError"),  # HTTP, as the SDKs and sailrl's Sail client speak it
    ("aiohttp.client_exceptions", "ClientError"),
    ("requests.exceptions", "RequestException"),
    ("builtins", "ConnectionError"), ("builtins", "TimeoutError"),  # refused, reset, timed out
    ("socket", "gaierror"), ("ssl", "SSLError"),  # a host name that does not resolve, a TLS failure
    ("torch", "OutOfMemoryError"), ("builtins", "MemoryError"),  # the embedded backend out of memory
})


def service_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a fault of a service, its HTTP transport or the embedded backend (a sailrl
    ``ServiceError`` included) rather than a bug in sailrl."""
    if isinstance(exc, ServiceError):
        return True
    return any((cls.__module__, cls.__qualname__) in _FAULT_CLASSES for cls in type(exc).__mro__)


def is_bug(exc: BaseException) -> bool:
    """Whether ``exc`` is a bug in sailrl: neither an error sailrl raises on purpose nor a service fault."""
    return not isinstance(exc, SailrlError) and not service_fault(exc)
