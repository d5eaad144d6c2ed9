"""The local clients are the SDK's classes: each subclasses its ``tinker`` counterpart, and what it does not do
is refused by name.

``LocalServiceClient`` is a ``tinker.ServiceClient``, ``LocalTrainingClient`` a ``tinker.TrainingClient``,
``LocalSamplingClient`` a ``tinker.SamplingClient`` and ``LocalRestClient`` a ``tinker``'s ``RestClient``, so code
that checks ``isinstance(client, tinker.TrainingClient)`` or annotates with the SDK's types takes them. None of them
calls the SDK's ``__init__`` (there is no server session), so an SDK method it inherited would fail deep inside the
SDK on a missing connection; :func:`refuse_the_rest` replaces every public SDK method a local class does not define
with one of the same signature that raises ``NotImplementedError`` naming the method, and the SDK's ``holder``-like
properties with ones that raise ``AttributeError`` the same way; each refusal's ``refuses`` attribute names what
it stands for. ``tests/backends/test_local_drift.py`` checks the result.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

C = TypeVar("C", bound=type)


def _message(sdk: type, name: str) -> str:
    return (f"The embedded backend does not implement {sdk.__name__}.{name} (it needs the Tinker service); "
            f"run against tinker.ServiceClient for it.")


def _refusal(sdk: type, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(inspect.unwrap(original)):
        @functools.wraps(original)
        async def refused_async(*args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(_message(sdk, name))

        refused_async.refuses = f"{sdk.__name__}.{name}"  # type: ignore[attr-defined]
        return refused_async

    @functools.wraps(original)
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(_message(sdk, name))

    refused.refuses = f"{sdk.__name__}.{name}"  # type: ignore[attr-defined]
    return refused


def _refused_property(sdk: type, name: str) -> property:
    def get(self: Any) -> Any:
        raise AttributeError(_message(sdk, name))

    get.refuses = f"{sdk.__name__}.{name}"  # type: ignore[attr-defined]
    return property(get)


def refuse_the_rest(sdk: type) -> Callable[[C], C]:
    """Class decorator: every public attribute of ``sdk`` (methods, static methods, properties) that the decorated
    class does not define itself, or inherit from a class other than ``sdk`` and its bases, is replaced by a
    refusal (see the module docstring)."""

    def decorate(cls: C) -> C:
        sdk_owned = set(sdk.__mro__)
        for name in dir(sdk):
            if name.startswith("_"):
                continue
            owner = next((c for c in cls.__mro__ if name in vars(c)), None)
            if owner is not None and owner not in sdk_owned:
                continue  # the local class (or a local base) defines it
            static = inspect.getattr_static(sdk, name)
            if isinstance(static, property):
                setattr(cls, name, _refused_property(sdk, name))
            elif isinstance(static, staticmethod):
                setattr(cls, name, staticmethod(_refusal(sdk, name, static.__func__)))
            elif isinstance(static, classmethod):
                setattr(cls, name, classmethod(_refusal(sdk, name, static.__func__)))
            elif callable(static):
                setattr(cls, name, _refusal(sdk, name, static))
        return cls

    return decorate
