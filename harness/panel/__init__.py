"""The reproducibility panel: see a turn, replay it, verify it, export it, in a browser.

``affidavit panel`` serves server-rendered pages (FastAPI, Jinja2, one small script) over a
read-only source: the running appliance's store (bodies opened with the appliance's key or
the user's), or an exported bundle (``--bundle DIR --key FILE``: the user's key, nothing can
run). It binds 127.0.0.1 by default and answers only a browser holding its access token.
See ``harness.panel.app`` for the routes and ``docs/cli.md`` for the command.
"""

from __future__ import annotations

__all__ = ["ApplianceSource", "BundleSource", "create_app", "running_panel"]

from typing import Any


def __getattr__(name: str) -> Any:  # FastAPI and Jinja2 load only when the panel is used
    if name == "create_app":
        from harness.panel.app import create_app

        return create_app
    if name == "running_panel":
        from harness.panel.server import running_panel

        return running_panel
    if name in ("ApplianceSource", "BundleSource"):
        from harness.panel import source

        return getattr(source, name)
    raise AttributeError(name)
