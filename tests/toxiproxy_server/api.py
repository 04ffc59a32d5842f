"""The HTTP/1.1 JSON API of Toxiproxy 2.x, as its clients use it.

==========================================  ==========================================
``GET /version``                            the version (JSON)
``POST /reset``                             enable every proxy, remove every toxic (204)
``GET /proxies``                            every proxy, by name, with its toxics
``POST /proxies``                           create a proxy (201; 409 if the name exists)
``POST /populate``                          create or replace a list of proxies (201)
``GET /proxies/{proxy}``                    one proxy with its toxics
``POST /proxies/{proxy}``                   update listen / upstream / enabled
``DELETE /proxies/{proxy}``                 delete a proxy and close its connections (204)
``GET /proxies/{proxy}/toxics``             the proxy's toxics
``POST /proxies/{proxy}/toxics``            add a toxic (200; 409 if the name exists)
``GET /proxies/{proxy}/toxics/{toxic}``     one toxic
``POST /proxies/{proxy}/toxics/{toxic}``    update a toxic's attributes and toxicity
``DELETE /proxies/{proxy}/toxics/{toxic}``  remove a toxic (204)
==========================================  ==========================================

Errors are ``{"error": MESSAGE, "status": CODE}`` with Toxiproxy's messages and
codes (400 bad body or toxic, 404 unknown proxy or toxic, 409 duplicate name,
500 a listen address that cannot be bound). Every response closes the connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.toxiproxy_server.proxies import Proxy, split_address
from tests.toxiproxy_server.toxics import ApiError, new_toxic

log = logging.getLogger("toxiproxy_server")

VERSION = "2.12.0-holdfast"
"""The Toxiproxy API version this server implements, marked as ours."""

MAX_BODY = 1024 * 1024
"""Largest request body accepted."""

Reply = tuple[int, Any]
"""An HTTP status and a JSON-able body (``None``: no body)."""


class Toxiproxy:
    """Every proxy of one server, and the API over them."""

    def __init__(self) -> None:
        self.proxies: dict[str, Proxy] = {}

    def stop(self) -> None:
        """Stop every proxy (the server is exiting)."""
        for proxy in self.proxies.values():
            proxy.stop()

    # -- HTTP -----------------------------------------------------------------------

    async def serve_http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one request on a connection, then close it."""
        try:
            try:
                method, path, body = await _read_request(reader)
                status, payload = await self.dispatch(method, path, body)
            except ApiError as error:
                status, payload = error.status, {"error": error.message, "status": error.status}
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            data = b"" if payload is None else json.dumps(payload).encode()
            head = [
                f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
                "Content-Type: application/json",
                f"Content-Length: {len(data)}",
                "Connection: close",
            ]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def dispatch(self, method: str, path: str, body: bytes) -> Reply:
        """Route one request; raises ``ApiError`` for the error answers."""
        parts = [unquote(p) for p in urlsplit(path).path.strip("/").split("/") if p]
        match (method, parts):
            case ("GET", ["version"]):
                return 200, {"version": VERSION}
            case ("POST", ["reset"]):
                await self.reset()
                return 204, None
            case ("GET", ["proxies"]):
                return 200, {name: p.to_json() for name, p in self.proxies.items()}
            case ("POST", ["proxies"]):
                proxy = await self.create(_json(body))
                return 201, proxy.to_json()
            case ("POST", ["populate"]):
                return 201, {"proxies": await self.populate(_json(body))}
            case ("GET", ["proxies", name]):
                return 200, self.proxy(name).to_json()
            case ("POST", ["proxies", name]):
                proxy = self.proxy(name)
                await proxy.update(_object(_json(body)))
                return 200, proxy.to_json()
            case ("DELETE", ["proxies", name]):
                self.proxy(name).stop()
                del self.proxies[name]
                return 204, None
            case ("GET", ["proxies", name, "toxics"]):
                return 200, [t.to_json() for t in self.proxy(name).toxics]
            case ("POST", ["proxies", name, "toxics"]):
                proxy = self.proxy(name)
                toxic = new_toxic(_json(body))
                proxy.add_toxic(toxic)
                return 200, toxic.to_json()
            case ("GET", ["proxies", name, "toxics", toxic_name]):
                return 200, self.proxy(name).toxic(toxic_name).to_json()
            case ("POST", ["proxies", name, "toxics", toxic_name]):
                updated = self.proxy(name).update_toxic(toxic_name, _object(_json(body)))
                return 200, updated.to_json()
            case ("DELETE", ["proxies", name, "toxics", toxic_name]):
                self.proxy(name).remove_toxic(toxic_name)
                return 204, None
        raise ApiError("not found", 404)

    # -- operations -----------------------------------------------------------------

    def proxy(self, name: str) -> Proxy:
        """The proxy called ``name`` (404 if none)."""
        proxy = self.proxies.get(name)
        if proxy is None:
            raise ApiError("proxy not found", 404)
        return proxy

    async def create(self, body: object) -> Proxy:
        """Create (and, unless ``enabled`` is false, start) a proxy."""
        fields = _object(body)
        name, upstream = fields.get("name"), fields.get("upstream")
        listen = fields.get("listen") or "127.0.0.1:0"
        enabled = fields.get("enabled", True)
        for key, value in (("name", name), ("upstream", upstream)):
            if not value:
                raise ApiError(f"missing required field: {key}", 400)
            if not isinstance(value, str):
                raise ApiError(f"bad request body: {key} must be a string", 400)
        if not isinstance(listen, str) or not isinstance(enabled, bool):
            raise ApiError("bad request body", 400)
        assert isinstance(name, str) and isinstance(upstream, str)
        if name in self.proxies:
            raise ApiError("proxy already exists", 409)
        try:
            split_address(listen)
            split_address(upstream)
        except ValueError as error:
            raise ApiError(str(error), 400) from None
        proxy = Proxy(name, listen, upstream, enabled=False)
        if enabled:
            await proxy.start()
        self.proxies[name] = proxy
        return proxy

    async def populate(self, body: object) -> list[dict[str, Any]]:
        """Create the listed proxies, replacing ones whose listen or upstream differ."""
        if not isinstance(body, list):
            raise ApiError("bad request body: expected a list of proxies", 400)
        result = []
        for item in body:
            fields = _object(item)
            existing = self.proxies.get(str(fields.get("name")))
            if existing is not None:
                same = (fields.get("listen"), fields.get("upstream")) == (
                    existing.listen,
                    existing.upstream,
                )
                if same:
                    result.append(existing.to_json())
                    continue
                existing.stop()
                del self.proxies[existing.name]
            result.append((await self.create(fields)).to_json())
        return result

    async def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        for proxy in self.proxies.values():
            proxy.remove_all_toxics()
            if not proxy.enabled:
                try:
                    await proxy.start()
                except ApiError as error:
                    log.warning("reset: proxy %s could not listen: %s", proxy.name, error)


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, _version = lines[0].split(" ", 2)
    except ValueError:
        raise ApiError("bad request line", 400) from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep:
            headers[key.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "identity").lower() != "identity":
        raise ApiError("chunked request bodies are not supported; send Content-Length", 411)
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise ApiError("bad Content-Length", 400) from None
    if not 0 <= length <= MAX_BODY:
        raise ApiError("request body too large", 413)
    body = await reader.readexactly(length) if length else b""
    return method.upper(), target, body


def _json(body: bytes) -> object:
    if not body.strip():
        return {}
    try:
        value: object = json.loads(body)
    except ValueError:
        raise ApiError("bad request body", 400) from None
    return value


def _object(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ApiError("bad request body: expected a JSON object", 400)
    return value
