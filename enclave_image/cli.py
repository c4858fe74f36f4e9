"""``affidavit image …``: the enclave image's commands (``verity`` here; ``build`` and
``measure`` join the sub-app :func:`register` returns).

Exit codes: 0 fine, 2 usage error (a bad salt, UUID or image size, a folder for the image),
3 an input is missing (the image, the hash file's folder). ``--json`` prints one JSON
document on stdout; errors go to stderr.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register"]

EXIT_MISSING = 3
#: ``veritysetup``'s default salt length.
SALT_BYTES = 32


def _missing(text: str) -> typer.Exit:
    print(f"affidavit: missing: {text}", file=sys.stderr, flush=True)
    return typer.Exit(EXIT_MISSING)


def _salt(text: str | None) -> bytes:
    """``--salt``: hex, ``-`` for none (as ``veritysetup`` takes it), default 32 random bytes."""
    if text is None:
        return secrets.token_bytes(SALT_BYTES)
    if text == "-":
        return b""
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not hex", param_hint="--salt") from None


def verity(
    image: Annotated[
        Path, typer.Argument(metavar="IMAGE", help="the disk image to protect (the data device)")
    ],
    out: Annotated[Path, typer.Option("--out", help="the hash file to write (replaced)")],
    salt: Annotated[
        str | None,
        typer.Option(help="the salt in hex, '-' for none (default: 32 random bytes)"),
    ] = None,
    uuid: Annotated[
        str | None, typer.Option(help="the superblock's UUID (default: a random one)")
    ] = None,
    data_device: Annotated[
        str, typer.Option(help="the data disk as the guest kernel sees it")
    ] = "/dev/vda",
    hash_device: Annotated[
        str, typer.Option(help="the hash disk as the guest kernel sees it")
    ] = "/dev/vdb",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Write a disk image's dm-verity hash tree; print its root hash and kernel cmdline.

    The hash file is what 'veritysetup format' writes (sha256, 4096-byte blocks, format 1).
    Give --salt and --uuid for a reproducible hash file; the root hash depends on the salt
    and the data only.
    """
    from enclave_image.verity import cmdline, format_verity

    if image.is_dir():
        raise typer.BadParameter(
            f"{image} is a folder: give the disk image file", param_hint="IMAGE"
        )
    if not image.is_file():
        raise _missing(f"{image} does not exist")
    if not out.parent.is_dir():
        raise _missing(f"{out.parent} (the folder for --out) does not exist")
    salt_bytes = _salt(salt)
    try:
        result = format_verity(image, out, salt=salt_bytes, uuid=uuid)
        fragment = cmdline(result, data_device=data_device, hash_device=hash_device)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if as_json:
        doc = {**result.json(), "hash_file": str(out), "cmdline": fragment}
        print(json.dumps(doc, indent=2))
        return
    print(f"root hash    {result.root_hash}")
    print(f"salt         {result.salt or '-'}")
    print(f"uuid         {result.uuid}")
    print(f"data blocks  {result.data_blocks} x {result.data_block_size} bytes")
    print(f"hash file    {out} ({result.hash_size} bytes, {result.levels} levels)")
    print(f"cmdline      {fragment}")


def register(app: typer.Typer) -> typer.Typer:
    """Add ``affidavit image`` to ``app``; return the sub-app for more image commands."""
    image_app = typer.Typer(help="the enclave image: its dm-verity tree", no_args_is_help=True)
    app.add_typer(image_app, name="image")
    image_app.command("verity")(verity)
    return image_app
