"""``affidavit image …``: the enclave image's commands: ``verity``, ``initrd``, ``inputs``
``measure`` and ``build`` (the reduced profile; ``--boot`` boots it under QEMU).

Exit codes: 0 fine, 1 a problem was found (``inputs``: a cached input missing or changed),
2 usage error (a bad salt, UUID, image size, version, key or vCPU type, a folder for the
image), 3 an input is missing (the image, the tree, the lock, the OVMF, the release key).
``--json`` prints one JSON document on stdout; errors go to stderr.
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


def initrd(
    root: Annotated[
        Path, typer.Argument(metavar="ROOT", help="the directory that becomes / in the initrd")
    ],
    out: Annotated[Path, typer.Option("--out", help="the initrd to write (replaced)")],
    epoch: Annotated[
        int | None,
        typer.Option(help="every entry's mtime (default: $SOURCE_DATE_EPOCH, else 0)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Write a directory tree as a reproducible initrd (gzip-compressed newc cpio).

    Owners 0:0, mtimes the epoch, modes 0755/0644, entries in byte order: the same tree
    gives the same bytes wherever and whenever it is built.
    """
    from enclave_image.initrd import write_initrd

    if not root.is_dir():
        raise _missing(f"{root} is not a directory")
    try:
        result = write_initrd(root, out, epoch=epoch)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if as_json:
        print(json.dumps({**result.json(), "initrd": str(out)}, indent=2))
        return
    print(f"initrd       {out} ({result.size} bytes, {result.entries} entries)")
    print(f"sha256       {result.sha256}")
    print(f"cpio sha256  {result.cpio_sha256}")
    print(f"epoch        {result.epoch}")


def inputs(
    cache: Annotated[Path, typer.Option("--cache", help="the folder of cached inputs")],
    lock: Annotated[Path, typer.Option("--lock", help="the lock file")] = Path(
        "enclave_image/image.lock.json"
    ),
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Check every cached build input against the lock file's SHA-256 pins.

    Exit 1 names each input missing from the cache or different from its pin.
    """
    from enclave_image.lock import LockError, load_lock, unpinned, verify_inputs

    if not lock.is_file():
        raise _missing(f"lock file {lock} does not exist")
    try:
        the_lock = load_lock(lock)
    except LockError as exc:
        raise typer.BadParameter(str(exc), param_hint="--lock") from None
    problems = verify_inputs(the_lock, cache)
    lacking = unpinned(the_lock)
    if as_json:
        doc = {
            "lock": str(lock),
            "cache": str(cache),
            "ok": not problems,
            "problems": [p.json() for p in problems],
            "unpinned": lacking,
        }
        print(json.dumps(doc, indent=2))
    else:
        for problem in problems:
            print(f"FAIL  {problem}")
        if lacking:
            print(f"note  the lock pins no {', '.join(lacking)} yet")
        print("inputs match the lock" if not problems else f"{len(problems)} input(s) differ")
    if problems:
        raise typer.Exit(1)


def measure(
    folder: Annotated[
        Path,
        typer.Argument(metavar="DIR", help="the image folder: vmlinuz, initrd.img, cmdline.txt"),
    ],
    ovmf: Annotated[Path, typer.Option("--ovmf", help="the pinned OVMF (AmdSev build)")],
    vcpus: Annotated[list[int], typer.Option("--vcpus", help="a vCPU count (repeat for more)")],
    vcpu_type: Annotated[
        list[str], typer.Option("--vcpu-type", help="a QEMU vCPU type, e.g. EPYC-v4 (repeatable)")
    ],
    version: Annotated[str, typer.Option("--version", help="the release; names the file")],
    release_key: Annotated[
        Path,
        typer.Option(
            "--release-key", help="the Ed25519 release private key (PEM, or base64 of 32 bytes)"
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="the folder for <version>.json and its .sig")
    ] = Path("measurements"),
    weights_digest: Annotated[
        str | None,
        typer.Option(help="sha256:<hex> of the model weights, if DIR has no model-weights.sha256"),
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="replace an existing <version>.json")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Compute an image's SEV-SNP launch measurements and publish them, signed.

    One measurement per (vCPU count, vCPU type) pair, for QEMU with guest features 0x1;
    writes OUT/<version>.json in the published format and OUT/<version>.json.sig.
    """
    from attestation.measure import MeasureError
    from enclave_image.publish import (
        MissingInput,
        PublishError,
        measure_image,
        read_image_dir,
        read_private_key,
        write_published,
    )

    launches = [(n, t) for t in vcpu_type for n in vcpus]
    try:
        key = read_private_key(release_key)
        image = read_image_dir(folder)
        published = measure_image(
            image, ovmf=ovmf, launches=launches, version=version, weights_digest=weights_digest
        )
        publication = write_published(published, out, key, replace=replace)
    except MissingInput as exc:
        raise _missing(str(exc)) from None
    except (PublishError, MeasureError) as exc:
        raise typer.BadParameter(str(exc)) from None
    if as_json:
        doc = {
            "published": str(publication.path),
            "signature": str(publication.signature),
            "release_public_key": publication.public_key,
            **publication.published.model_dump(mode="json", exclude_defaults=True),
        }
        print(json.dumps(doc, indent=2))
        return
    p = publication.published
    print(f"published    {publication.path} (signature {publication.signature.name})")
    print(f"release key  {publication.public_key}")
    print(f"image        {p.image_digest}")
    print(f"weights      {p.model_weights_digest}")
    print(f"ovmf sha256  {p.firmware['ovmf_sha256']}")
    for launch in p.snp:
        print(f"snp          {launch.vcpus} x {launch.vcpu_type}  {launch.measurement}")


def build(
    out: Annotated[Path, typer.Option("--out", help="the folder for the image (created)")],
    profile: Annotated[str, typer.Option(help="reduced (proxy + health only) or full")] = "reduced",
    cache: Annotated[
        Path, typer.Option(help="where downloaded .deb files and wheels are kept")
    ] = Path(".affidavit/image-cache"),
    epoch: Annotated[
        int | None,
        typer.Option(help="the initrd's mtimes (default: $SOURCE_DATE_EPOCH, else 0)"),
    ] = None,
    boot: Annotated[
        bool, typer.Option("--boot", help="then boot it under QEMU (TCG) and wait for health")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Build the enclave image: vmlinuz, initrd.img, cmdline, model.img and model.verity.

    The reduced profile holds busybox, Python, the proxy and a health check that prints
    'affidavit-proxy healthy …' on the serial console. Needs apt-get, dpkg-deb and pip.
    """
    from enclave_image.build import boot as boot_image
    from enclave_image.build import build_reduced
    from enclave_image.initrd import source_date_epoch

    if profile == "full":
        print("affidavit: the full profile is not built yet", file=sys.stderr, flush=True)
        raise typer.Exit(2)
    if profile != "reduced":
        raise typer.BadParameter(f"{profile!r}: reduced or full", param_hint="--profile")
    try:
        result = build_reduced(out, cache, epoch=source_date_epoch(epoch))
    except RuntimeError as exc:
        print(f"affidavit: image build failed: {exc}", file=sys.stderr, flush=True)
        raise typer.Exit(1) from None
    doc: dict[str, object] = {"profile": profile, **result.json()}
    if boot:
        booted = boot_image(out)
        doc["health"] = booted.health
        doc["boot_seconds"] = round(booted.seconds, 1)
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        for key, value in doc.items():
            print(f"{key}: {value}")
    if boot and doc["health"] is None:
        raise typer.Exit(1)


def register(app: typer.Typer) -> typer.Typer:
    """Add ``affidavit image`` to ``app``; return the sub-app for more image commands."""
    image_app = typer.Typer(
        help="the enclave image: dm-verity tree, initrd, pinned inputs, measurements",
        no_args_is_help=True,
    )
    app.add_typer(image_app, name="image")
    image_app.command("verity")(verity)
    image_app.command("initrd")(initrd)
    image_app.command("inputs")(inputs)
    image_app.command("measure")(measure)
    image_app.command("build")(build)
    return image_app
