"""What keeps the studio's port safe: a per-session token, Host and Origin checks, and confined paths.

- Every request needs the session token. The URL the command prints carries it (``/?token=...``); that request
  sets an HttpOnly, SameSite=Strict cookie and redirects to ``/`` so the token leaves the address bar. Any other
  request without the cookie (or an ``X-Studio-Token`` header) is refused with 401.
- The ``Host`` header must name the address the server listens on (``127.0.0.1:PORT``, ``localhost:PORT``,
  ``[::1]:PORT``, or the ``--host`` given): a page on another site that points its own name at 127.0.0.1
  (DNS rebinding) is refused with 403.
- A request that carries an ``Origin`` must come from the studio's own origin (403 otherwise), and a POST must
  carry a JSON body, so another site's form or script cannot make the studio act.
- :func:`confined` resolves a user-given relative path inside one folder, refusing absolute paths, ``..`` and
  symbolic links that lead out of it.
"""

from __future__ import annotations

import hmac
import secrets
import socket
from http.cookies import SimpleCookie
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import parse_qs

from sailrl.spec.errors import UserError

COOKIE = "sailrl_studio"  # the cookie's name is COOKIE-PORT (cookie_name): a browser keeps one jar per host name,
# not per port, so two studios on 127.0.0.1 with one name would overwrite each other's token (the first then 401s)
HEADER = "x-studio-token"
MAX_BODY_BYTES = 2 * 1024 * 1024  # a spec is at most 256 KiB; a completion at most 200,000 characters

_SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                 b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


class PathRefused(UserError, ValueError):
    """A path that would leave its folder (plain words in ``str(exc)``)."""

    code = "E210"


def cookie_name(port: int) -> str:
    """The session cookie's name for a studio on ``port`` (see :data:`COOKIE`)."""
    return f"{COOKIE}-{port}"


def new_token() -> str:
    """A fresh session token (32 random bytes, URL-safe)."""
    return secrets.token_urlsafe(32)


def _own_names() -> set[str]:
    """This machine's host name and the addresses it resolves to (from /etc/hosts or the resolver; bounded by it)."""
    name = socket.gethostname()
    names = {name}
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except OSError:
        infos = []
    for info in infos:
        addr = str(info[4][0])
        names.add(f"[{addr}]" if ":" in addr else addr)
    return names


def allowed_hosts(host: str, port: int) -> frozenset[str]:
    """The ``Host`` header values a server on ``host:port`` answers to: the address itself, the loopback names for a
    loopback address, and for a wildcard address (``0.0.0.0``, ``::``) also this machine's name and addresses."""
    host = host.strip("[]")
    names = {host}
    if host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::"):
        names |= {"127.0.0.1", "localhost", "[::1]"}
    if host in ("0.0.0.0", "::"):
        names |= _own_names()
    if ":" in host and not host.startswith("["):
        names.add(f"[{host}]")
    return frozenset(f"{n}:{port}" for n in names)


def confined(base: Path, relative: str) -> Path:
    """``base / relative``, resolved, when it stays inside ``base``; else :class:`PathRefused`.

    Refused: an empty path, an absolute path, a ``..`` component, a NUL byte, and any path whose resolved form
    (symbolic links followed) lies outside ``base``'s resolved form.
    """
    if not relative or "\x00" in relative:
        raise PathRefused("no path given")
    pure = PurePosixPath(relative.replace("\\", "/"))
    if pure.is_absolute() or relative.startswith(("/", "\\")) or (len(relative) > 1 and relative[1] == ":"):
        raise PathRefused(f"{relative!r} is an absolute path: give a path inside {base.name}/")
    if ".." in pure.parts:
        raise PathRefused(f"{relative!r} goes up a folder ('..'): give a path inside {base.name}/")
    root = base.resolve()
    target = (root / pure).resolve()
    if target != root and not target.is_relative_to(root):
        raise PathRefused(f"{relative!r} leads outside {base.name}/ (a symbolic link)")
    return target


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k == name:
            return v.decode("latin-1")
    return None


def _cookie_token(scope: dict[str, Any], name: str) -> str | None:
    raw = _header(scope, b"cookie")
    if not raw:
        return None
    jar = SimpleCookie()
    try:
        jar.load(raw)
    except Exception:  # noqa: BLE001 -- a malformed cookie header is no token
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None else None


class Guard:
    """ASGI middleware: the token, Host and Origin rules of the module docstring, security headers, body cap."""

    def __init__(self, app: Any, *, token: str, hosts: frozenset[str], cookie: str = COOKIE) -> None:
        self.app = app
        self.cookie = cookie
        self.token = token
        self.hosts = hosts
        self.origins = frozenset(f"http://{h}" for h in hosts)

    def _token_ok(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.token.encode())

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self.app(scope, receive, send)
            return
        host = _header(scope, b"host")
        if host not in self.hosts:
            return await _plain(send, 403, "refused: this address is not the studio's (Host header "
                                           f"{host!r}); open the URL that `sailrl studio` printed")
        origin = _header(scope, b"origin")
        if origin is not None and origin not in self.origins:
            return await _plain(send, 403, f"refused: a request from another site ({origin!r})")
        method = scope["method"]
        if method not in ("GET", "HEAD", "POST"):
            return await _plain(send, 405, "method not allowed")
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        given = query.get("token", [None])[0]
        if scope["path"] == "/" and method == "GET" and given is not None:
            if not self._token_ok(given):
                return await _plain(send, 401, "refused: wrong session token; open the URL that `sailrl studio` "
                                               "printed in this session")
            cookie = f"{self.cookie}={self.token}; HttpOnly; SameSite=Strict; Path=/"
            return await _plain(send, 303, "see /", extra=[(b"location", b"/"), (b"set-cookie", cookie.encode())])
        if not (self._token_ok(_cookie_token(scope, self.cookie)) or self._token_ok(_header(scope, HEADER.encode()))):
            return await _plain(send, 401, "refused: no session token; open the URL that `sailrl studio` printed "
                                           "(it carries the token)")
        if method == "POST":
            ctype = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
            if ctype != "application/json":
                return await _plain(send, 415, "refused: the studio's API takes JSON bodies only")
            length = _header(scope, b"content-length")
            if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
                return await _plain(send, 413, f"refused: the request is larger than {MAX_BODY_BYTES:,} bytes")
            receive = _capped(receive)

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + _SECURITY_HEADERS
            await send(message)

        await self.app(scope, receive, send_with_headers)


class BodyTooLarge(UserError):
    """A streamed request body ran past :data:`MAX_BODY_BYTES`."""

    code = "E211"


def _capped(receive: Any) -> Any:
    seen = 0

    async def wrapped() -> dict[str, Any]:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > MAX_BODY_BYTES:
                raise BodyTooLarge(f"the request is larger than {MAX_BODY_BYTES:,} bytes")
        return message

    return wrapped


async def _plain(send: Any, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = (text + "\n").encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
               *_SECURITY_HEADERS, *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
