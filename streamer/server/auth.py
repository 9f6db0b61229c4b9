"""`--api-key`: requests carry `Authorization: Bearer KEY`, as OpenAI's clients send their key."""

from __future__ import annotations

import hmac

from .fields import ApiError

OPEN_ROUTES = ("/health",)  # a load balancer's probe carries no key


def check_key(key: str | None, route: str, header: str | None) -> None:
    """ApiError 401 unless the server has no key, the route is open, or `header` carries it."""
    if key is None or route in OPEN_ROUTES:
        return
    scheme, _, given = (header or "").partition(" ")
    # compare_digest: the time taken says nothing about how much of the key matched
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode()):
        return
    raise ApiError(
        401,
        "a valid API key is required: send the header `Authorization: Bearer KEY` with the "
        "server's --api-key",
        code="invalid_api_key",
    )
