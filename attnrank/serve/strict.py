"""Request bodies read as JSON that names each key once.

Python's ``json`` (which FastAPI reads bodies with) keeps the last of two equal keys, so
``{"query": "safe", "query": "other"}`` was answered for ``"other"`` with 200, while a proxy or
log that reads the first saw ``"safe"``: the same body meant two things. :class:`StrictJSONRoute`
refuses such a body (422, naming the key) at any depth, as the routes' ``extra="forbid"`` refuses
a key the request does not have.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from ..errors import InputError, require

require("fastapi", "serve", "attnrank serve")

from fastapi import Request, Response
from fastapi.routing import APIRoute


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: the object, or an :class:`InputError` naming a key given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InputError(f"the body gives the key {key!r} twice in one object; send each key once")
        out[key] = value
    return out


class StrictJSONRequest(Request):
    """A request whose ``json()`` refuses an object with a key given twice (:func:`unique_keys`)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), object_pairs_hook=unique_keys)
        return self._json


class StrictJSONRoute(APIRoute):
    """An :class:`~fastapi.routing.APIRoute` whose handler reads the body as :class:`StrictJSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict
