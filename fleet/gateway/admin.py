"""The gateway's admin API: replicas that come and go at runtime (the autoscaler's hands).

In:  HTTP from loopback only (another address gets 403: the gateway may listen wider than the
     machine, its pool may not be changed from there):
     ``GET /admin/replicas``: every replica with its health, in-flight count, draining flag and
     first token time; ``POST /admin/replicas`` ``{"name", "model", "url", "adapters": []}``: a
     replica joins, unhealthy until its health probe passes (probed at once, then with the
     others); ``POST /admin/replicas/{name}/drain``: it gets no new request and finishes what it
     has; ``DELETE /admin/replicas/{name}``: it leaves, refused with 409 while requests are in
     flight on it (drain first, wait for ``in_flight`` 0).
Out: JSON: the replica (or the list); errors as ``{"error": "..."}`` with 400, 403, 404, 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from fleet.gateway.routing import ReplicaState

if TYPE_CHECKING:
    from fleet.gateway.server import Gateway

__all__ = ["mount", "replica_json"]

log = logging.getLogger("fleetscope.gateway.admin")


def replica_json(replica: ReplicaState) -> dict[str, Any]:
    return {
        "name": replica.name,
        "model": replica.model,
        "url": replica.url,
        "healthy": replica.healthy,
        "draining": replica.draining,
        "in_flight": replica.in_flight,
        "first_token_at": replica.first_token_at,
        "healthy_since": replica.healthy_since,
        "adapters": list(replica.adapters),
    }


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _loopback(request: web.Request) -> bool:
    try:
        return ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
    except ValueError:
        return False


class _Admin:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._probes: set[asyncio.Task[None]] = set()

    @web.middleware
    async def guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/admin/") and not _loopback(request):
            return _error(403, f"the admin API answers loopback only, not {request.remote}")
        response: web.StreamResponse = await handler(request)
        return response

    async def list(self, _request: web.Request) -> web.Response:
        return web.json_response({"replicas": [replica_json(r) for r in self.gateway.router.replicas]})

    async def add(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            name, model, url = str(body["name"]), str(body["model"]), str(body["url"]).rstrip("/")
            adapters = tuple(str(a) for a in body.get("adapters") or ())
        except (ValueError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            return _error(400, f'a replica needs a JSON body with "name", "model" and "url" ({exc!r})')
        if not url.startswith(("http://", "https://")):
            return _error(400, f"url {url!r} must start with http:// or https://")
        replica = ReplicaState(name, model, url, healthy=False, adapters=adapters)
        try:
            self.gateway.router.add(replica)
        except ValueError as exc:
            return _error(409, str(exc))
        log.info("replica %s (%s) added at %s: in once healthy", name, model, url)
        task = asyncio.create_task(self.gateway.probe(replica))  # probed now rather than at the next round
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)
        return web.json_response(replica_json(replica), status=201)

    async def drain(self, request: web.Request) -> web.Response:
        replica = self.gateway.router.get(request.match_info["name"])
        if replica is None:
            return _error(404, f"no replica named {request.match_info['name']!r}")
        if not replica.draining:
            log.info("replica %s draining (%d in flight)", replica.name, replica.in_flight)
        replica.draining = True
        return web.json_response(replica_json(replica))

    async def delete(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        replica = self.gateway.router.get(name)
        if replica is None:
            return _error(404, f"no replica named {name!r}")
        if replica.in_flight:
            return _error(409, f"replica {name} has {replica.in_flight} request(s) in flight: drain it and wait")
        self.gateway.router.remove(name)
        metrics = self.gateway.metrics
        for gauge in (metrics.healthy, metrics.in_flight):
            with contextlib.suppress(KeyError):
                gauge.remove(name)
        log.info("replica %s removed", name)
        return web.json_response(replica_json(replica))


def mount(gateway: Gateway, app: web.Application) -> None:
    """The admin routes on the gateway's app, guarded to loopback."""
    admin = _Admin(gateway)
    app.middlewares.append(admin.guard)
    app.router.add_get("/admin/replicas", admin.list)
    app.router.add_post("/admin/replicas", admin.add)
    app.router.add_post("/admin/replicas/{name}/drain", admin.drain)
    app.router.add_delete("/admin/replicas/{name}", admin.delete)
