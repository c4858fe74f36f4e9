"""Who may use the panel, and from where: browser sessions and the cross-site guard.

The access token is shown once (in the URL ``affidavit panel`` prints) and never stored in
the browser: signing in with it opens a browser session whose cookie is a fresh random
value, mapped here to that session. A cookie alone is not enough to change anything: a
state-changing request (every POST) must come from one of the panel's own pages, which a
browser says with ``Sec-Fetch-Site`` and ``Origin``. SameSite=Strict alone does not stop a
page on another port of the same host (same site, other origin) from posting a form.
"""

from __future__ import annotations

import hashlib
import secrets
import threading

from starlette.requests import Request

__all__ = ["SAFE_METHODS", "BrowserSessions", "cross_site_refusal", "own_origin"]

#: Methods that change nothing: the only ones served without the cross-site check.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: ``Sec-Fetch-Site`` values of a request the user made on the panel itself.
OWN_FETCH_SITES = frozenset({"same-origin", "none"})


class BrowserSessions:
    """The browser sessions the access token opened, by cookie value.

    Only a digest of each value is kept, so a lookup's timing says nothing about the values.
    """

    def __init__(self) -> None:
        self._digests: set[bytes] = set()
        self._lock = threading.Lock()

    @staticmethod
    def _digest(value: str) -> bytes:
        return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()

    def open(self) -> str:
        """A new session's cookie value: random, and unrelated to the access token."""
        value = secrets.token_urlsafe(32)
        with self._lock:
            self._digests.add(self._digest(value))
        return value

    def holds(self, value: str) -> bool:
        if not value:
            return False
        with self._lock:
            return self._digest(value) in self._digests


def own_origin(request: Request) -> str:
    """The panel's origin as the browser addressed it: scheme and ``Host``."""
    return f"{request.url.scheme}://{request.url.netloc}".lower()


def cross_site_refusal(request: Request, *, bearer: bool) -> str | None:
    """Why a state-changing request is refused as not coming from the panel's own pages
    (None: it may proceed). ``bearer``: it authenticated with ``Authorization: Bearer``."""
    site = request.headers.get("sec-fetch-site")
    origin = request.headers.get("origin")
    if site is not None and site.strip().lower() not in OWN_FETCH_SITES:
        return (
            f"refused a cross-site request (Sec-Fetch-Site: {site}): the panel takes a "
            f"{request.method} only from its own pages"
        )
    if origin is not None and origin.strip().lower() != own_origin(request):
        return (
            f"refused a cross-site request (Origin: {origin}): the panel takes a "
            f"{request.method} only from its own origin, {own_origin(request)}"
        )
    if site is None and origin is None and not bearer:
        return (
            f"refused a {request.method} with the panel's cookie but neither Origin nor "
            "Sec-Fetch-Site (a browser sends them); a client that is not a browser "
            "authenticates with `Authorization: Bearer <token>`"
        )
    return None
