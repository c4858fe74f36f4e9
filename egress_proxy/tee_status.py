"""What the appliance found when it checked its own evidence, as the proxy reads it.

The full image's PID 1 checks its boot evidence (``attestation.self_check``) once the proxy
runs, and writes the outcome as a small JSON file (root's, 0644, in the run folder: fresh at
each boot); the proxy's config names the file (``tee_status``) and the control plane reads it
at each call that would pin a session (``OpenSession`` with pins, ``SetPins``). A pinned
session claims reproducible, attested inference: an appliance that could not show itself
attested refuses it, unless its boot options said ``affidavit.unattested=allow`` (then every
reproducibility block says ``tee_type: none``). A missing file means the check has not run
yet: refused too.

No file named (``tee_status`` unset: ``affidavit up`` on a developer's machine) is today's
behaviour: nothing is checked here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "FORMAT",
    "MAX_BYTES",
    "REFUSAL",
    "TeeStatus",
    "TeeStatusError",
    "TeeStatusUnreadable",
    "pins_refusal",
    "read_tee_status",
    "write_tee_status",
]

FORMAT: Final = "affidavit/tee-status/v1"
#: A status is a few hundred bytes; anything past this is not one.
MAX_BYTES = 64 * 1024
#: Every refusal's message begins so (the harness recognises it and says it in one line).
REFUSAL = "pinned sessions are refused: "


class TeeStatus(BaseModel):
    """The outcome of the appliance's check of its own evidence."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["affidavit/tee-status/v1"] = FORMAT
    attested: bool
    tee_type: Literal["sev-snp", "tdx", "none"]
    allow_unattested: bool = False
    reason: str | None = Field(default=None, max_length=4096)  # the first failing check
    checked_at: AwareDatetime  # RFC 3339, with its offset

    def json_bytes(self) -> bytes:
        return self.model_dump_json(indent=2).encode() + b"\n"


class TeeStatusError(Exception):
    """The status file is there but is not a status (too large, not JSON, not this format)."""


class TeeStatusUnreadable(TeeStatusError):
    """The status file cannot be read (permissions, a folder in its place)."""


def read_tee_status(path: Path) -> TeeStatus | None:
    """The status in ``path``; None when there is no such file (the check has not run yet).

    Raises:
        TeeStatusUnreadable: it cannot be read.
        TeeStatusError: it is larger than ``MAX_BYTES`` or not a status, naming why.
    """
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TeeStatusUnreadable(f"{path}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise TeeStatusError(f"{path} is larger than {MAX_BYTES} bytes")
    try:
        return TeeStatus.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(the file)"
        raise TeeStatusError(f"{path}: {where}: {first['msg']}") from None


def write_tee_status(path: Path, status: TeeStatus) -> None:
    """Write ``status`` whole (a temporary name, then renamed), mode 0644: the proxy's uid
    reads it, only its writer (root, in the guest) may change it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(status.json_bytes())
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)  # whatever the umask
    os.replace(tmp, path)


def pins_refusal(status: TeeStatus | None) -> str | None:
    """None when pinned sessions may open (attested, or unattested operation allowed); else
    one sentence saying why not."""
    if status is None:
        return "the appliance has not checked its evidence yet"
    if status.attested or status.allow_unattested:
        return None
    why = status.reason or "no reason given"
    return (
        f"the appliance's check of its own evidence failed ({why}); it runs with tee_type none,"
        " and only affidavit.unattested=allow on its kernel command line lets it pin sessions"
    )
