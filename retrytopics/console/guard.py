"""What every request passes before the console's routes: the rebinding guard, the body limits, and the
security headers on every response.

A raw ASGI layer, outside Starlette's own error handling (so that a 500 carries the headers too) and before any
byte of a body is read: a POST whose body is too large, of unknown size, or not a urlencoded form is refused
from its headers alone (a multipart body would otherwise be spooled to disk, a urlencoded one held in memory,
whatever the route then decides). On a loopback bind, a request whose `Host` is not a loopback name is
refused: a page of another site that rebinds its own name to 127.0.0.1 cannot reach the console.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from starlette.responses import Response

__all__ = ["CONTENT_SECURITY_POLICY", "MAX_BODY_BYTES", "Guard", "is_loopback"]

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]
#: The largest request body read: a replay form of `actions.MAX_SELECTION` records and a filter fits.
MAX_BODY_BYTES: Final = 256 * 1024


def is_loopback(host: str) -> bool:
    """Whether `host` (a bind address, or a Host header's name without its port) names this machine only:
    `localhost` or any address of 127.0.0.0/8 and ::1."""
    name = host.strip().lower().removeprefix("[").removesuffix("]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """A Host header's name without its port (`[::1]:8765` → `::1`)."""
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rpartition(":")[0] if value.count(":") == 1 else value


class Guard:
    """The outermost layer, around Starlette's own error handling: the CSP and companion headers on every
    response (errors and 500s included); on a loopback bind, a request whose Host is not a loopback name is
    refused (DNS rebinding); a POST whose body is too large, of unknown size or not a urlencoded form is
    refused before a byte of it is read."""

    def __init__(self, app: Callable[..., Awaitable[None]], *, loopback: bool) -> None:
        self.app = app
        self.loopback = loopback

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await Response(refusal[1], status_code=refusal[0], media_type="text/plain")(
                scope, receive, send_with_headers
            )
            return
        await self.app(scope, _bounded(receive), send_with_headers)

    def _refusal(self, scope: MutableMapping[str, Any]) -> tuple[int, str] | None:
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if self.loopback and not is_loopback(_host_name(headers.get(b"host", b"").decode("latin-1"))):
            return 400, "Invalid host header"
        if scope.get("method") not in ("POST", "PUT", "PATCH", "DELETE"):
            return None
        size = headers.get(b"content-length", b"").decode("latin-1").strip()
        if not (size.isascii() and size.isdigit()):
            return 411, "a POST needs a Content-Length"
        if int(size) > MAX_BODY_BYTES:
            return 413, f"a request body of at most {MAX_BODY_BYTES} bytes"
        kind = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if int(size) and kind != "application/x-www-form-urlencoded":
            return 415, "a form (application/x-www-form-urlencoded) only"
        return None


def _bounded(receive: Any) -> Any:
    """`receive` that ends the request once more than `MAX_BODY_BYTES` arrived (a client sending more than
    its Content-Length said)."""
    received = 0

    async def bounded() -> Any:
        nonlocal received
        message = await receive()
        if message.get("type") == "http.request":
            received += len(message.get("body", b""))
            if received > MAX_BODY_BYTES:
                return {"type": "http.disconnect"}
        return message

    return bounded
