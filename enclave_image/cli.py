"""``affidavit image …``: the enclave image's commands: ``verity``, ``initrd``, ``inputs``,
``lock``, ``measure``, ``compare``, ``build`` (``--boot`` boots it under QEMU), ``ovmf`` (the
pinned AmdSev firmware), ``release`` (``make release``: build, measure every shape, sign) and
``config-disk`` (an operator's config disk: the shared record store).

Exit codes: 0 fine, 1 a problem was found (``inputs``: a cached input missing or changed;
``measure``: the image is a test build, without ``--allow-test-model``; ``release``, ``ovmf``:
the build failed),
2 usage error (a bad salt, UUID, image size, version, key or vCPU type, a folder for the
image; ``release``: a key kept in the checkout or readable by others, a key that is not
``release.pub``'s, a release already published), 3 an input is missing (the image, the tree,
the lock, the OVMF, the release key; ``config-disk``: the ``postgres`` extra).
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
    lock: Annotated[
        Path | None, typer.Option("--lock", help="the lock file (default: enclave_image's)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Check every cached build input against the lock file's SHA-256 pins.

    Exit 1 names each input missing from the cache or different from its pin.
    """
    from enclave_image.inputs import LOCK_FILE
    from enclave_image.lock import LockError, load_lock, unpinned, verify_inputs

    lock = lock or LOCK_FILE
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
        print(
            "inputs match the lock"
            if not problems
            else f"{len(problems)} {'input differs' if len(problems) == 1 else 'inputs differ'}"
        )
    if problems:
        raise typer.Exit(1)


def measure(
    folder: Annotated[
        Path,
        typer.Argument(metavar="DIR", help="the image folder: vmlinuz, initrd.img, cmdline.txt"),
    ],
    ovmf: Annotated[Path, typer.Option("--ovmf", help="the pinned OVMF (AmdSev build)")],
    vcpus: Annotated[
        list[int], typer.Option("--vcpus", metavar="N", help="a vCPU count (repeat for more)")
    ],
    vcpu_type: Annotated[
        list[str],
        typer.Option(
            "--vcpu-type", metavar="TYPE", help="a QEMU vCPU type, e.g. EPYC-v4 (repeatable)"
        ),
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
    allow_test_model: Annotated[
        bool,
        typer.Option(
            "--allow-test-model",
            help="measure a test build (--test-model) anyway: never for a release",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Compute an image's SEV-SNP launch measurements and publish them, signed.

    One measurement per (vCPU count, vCPU type) pair, for QEMU with guest features 0x1;
    writes OUT/<version>.json in the published format and OUT/<version>.json.sig. A test
    build (built with --test-model: inputs.json says so) is refused, exit 1, unless
    --allow-test-model is given.
    """
    from attestation.measure import MeasureError
    from enclave_image.publish import (
        MissingInput,
        PublishError,
        TestBuildError,
        measure_image,
        read_image_dir,
        read_private_key,
        write_published,
    )

    launches = [(n, t) for t in vcpu_type for n in vcpus]
    try:
        key = read_private_key(release_key)
        image = read_image_dir(folder)
        if image.test_model is not None and allow_test_model:
            print(
                f"affidavit: WARNING: {folder} is a TEST build (test model {image.test_model}):"
                " measured because of --allow-test-model; never publish it as a release",
                file=sys.stderr,
                flush=True,
            )
        published = measure_image(
            image, ovmf=ovmf, launches=launches, version=version,
            weights_digest=weights_digest, allow_test_model=allow_test_model,
        )  # fmt: skip
        publication = write_published(published, out, key, replace=replace)
    except TestBuildError as exc:
        print(f"affidavit: refusing to measure {folder}: {exc}", file=sys.stderr, flush=True)
        raise typer.Exit(1) from None
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
    print(f"launch       {p.vmm_type}, guest policy {p.guest_policy}, features {p.guest_features}")
    for launch in p.snp:
        print(f"snp          {launch.vcpus} x {launch.vcpu_type}  {launch.measurement}")


def compare(
    folder: Annotated[
        Path,
        typer.Argument(
            metavar="DIR", help="the rebuilt image folder: vmlinuz, initrd.img, cmdline[.txt]"
        ),
    ],
    published: Annotated[
        Path,
        typer.Argument(metavar="PUBLISHED", help="the release's <version>.json (.sig beside it)"),
    ],
    ovmf: Annotated[Path, typer.Option("--ovmf", help="the pinned OVMF (AmdSev build)")],
    release_key: Annotated[
        Path | None,
        typer.Option(
            "--release-key",
            help="the release PUBLIC key, base64 (default: measurements/release.pub)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Recompute a rebuilt image's digests and launch measurements; compare with a release.

    Checks the published file's signature with the release public key first, then prints
    one line per compared field (image_digest, kernel_cmdline, model_weights_digest,
    firmware.ovmf_sha256, each snp launch). Exit 0 when every field matches, 1 when one
    differs or the signature does not verify. Needs no private key.
    """
    from attestation.cli import RELEASE_KEY
    from attestation.measure import MeasureError
    from attestation.published import (
        PublishedError,
        SignatureMismatch,
        load_published,
        read_public_key,
    )
    from attestation.verdict import Check
    from enclave_image.publish import MissingInput, PublishError, compare_image, read_image_dir

    key_path = release_key or RELEASE_KEY
    for path, what in ((published, "published file"), (key_path, "release public key")):
        if not path.is_file():
            raise _missing(f"{what} {path} does not exist")
    sig = published.with_name(published.name + ".sig")
    if not sig.is_file():
        raise _missing(f"signature {sig} does not exist")
    try:
        promised = load_published(published, read_public_key(key_path))
    except SignatureMismatch as exc:  # a problem found: nothing in the file is believed
        checks = [Check("signature", False, str(exc))]
    except PublishedError as exc:
        raise typer.BadParameter(str(exc)) from None
    else:
        try:
            image = read_image_dir(folder)
            checks = [
                Check("signature", True, f"{published} is signed by the release key {key_path}"),
                *compare_image(image, promised, ovmf=ovmf),
            ]
        except MissingInput as exc:
            raise _missing(str(exc)) from None
        except (PublishError, MeasureError) as exc:
            raise typer.BadParameter(str(exc)) from None
    ok = all(c.ok is not False for c in checks)
    if as_json:
        doc = {"match": ok, "published": str(published), "checks": [c.json() for c in checks]}
        print(json.dumps(doc, indent=2))
    else:
        for check in checks:
            print(check.line())
        version = promised.version if checks[0].ok else str(published)
        print(
            f"match: the rebuilt image is what {version} publishes"
            if ok
            else f"MISMATCH: the rebuilt image is not what {version} publishes"
        )
    if not ok:
        raise typer.Exit(1)


def ovmf(
    cache: Annotated[
        Path, typer.Option(help="where the firmware is built and kept (its ovmf/ folder)")
    ] = Path(".affidavit/image-cache"),
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Build (or reuse) the pinned SEV firmware, edk2's AmdSev OVMF, from Debian's source.

    Writes CACHE/ovmf/OVMF.amdsev.fd (~2 min the first time; a file already there with the
    pinned sha256 is reused) and prints its path and sha256, which must be the published
    file's firmware.ovmf_sha256. Exit 1 when the build fails or gives other bytes.
    """
    from enclave_image.ovmf import OVMF_SHA256, OvmfError, build_amdsev_ovmf

    try:
        result = build_amdsev_ovmf(cache, expect=OVMF_SHA256)
    except OvmfError as exc:
        print(f"affidavit: the AmdSev OVMF: {exc}", file=sys.stderr, flush=True)
        raise typer.Exit(1) from None
    if as_json:
        doc = {"ovmf": str(result.path), "sha256": result.sha256, "built": result.built}
        print(json.dumps(doc, indent=2))
        return
    print(f"ovmf    {result.path}")
    print(f"sha256  {result.sha256} (the pin in enclave_image/ovmf.py)")


def release(
    version: Annotated[
        str | None, typer.Option("--version", help="the release, x.y.z; names the file")
    ] = None,
    release_key: Annotated[
        Path | None,
        typer.Option(
            "--release-key",
            help="the Ed25519 release private key, outside the checkout, mode 600",
        ),
    ] = None,
    measurements: Annotated[
        Path | None,
        typer.Option(help="the folder for <version>.json, its .sig and release.pub"),
    ] = None,
    build_dir: Annotated[
        Path | None,
        typer.Option(help="the folder for the release image (default .affidavit/release/V)"),
    ] = None,
    cache: Annotated[
        Path, typer.Option(help="where the pinned inputs and the firmware are kept")
    ] = Path(".affidavit/image-cache"),
    ovmf_file: Annotated[
        Path | None,
        typer.Option("--ovmf", help="the firmware, if not the cache's (must be the pinned one)"),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="a throwaway key (unless given) and a temporary folder; never measurements/",
        ),
    ] = False,
    replace: Annotated[
        bool, typer.Option("--replace", help="replace an existing <version>.json")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="print one JSON document (progress on stderr)")
    ] = False,
) -> None:
    """Cut a release (make release): the pinned AmdSev firmware, a release build of the full
    profile, its SNP launch digest for every shape of the release table, and
    MEASUREMENTS/<version>.json with its signature (docs/release.md).

    The key must be kept outside the checkout and readable by its owner only, and its public
    half must be MEASUREMENTS/release.pub. --dry-run does it all with a throwaway key in a
    temporary folder, and prints where.
    """
    import tempfile

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from enclave_image.inputs import InputError
    from enclave_image.publish import (
        RELEASE_SHAPES,
        MissingInput,
        PublishError,
        cut_release,
        public_key_text,
    )
    from inference.pull import PullError

    say = (lambda line: print(line, file=sys.stderr, flush=True)) if as_json else print
    if dry_run:
        version = version or "0.0.0-dry-run"
        if measurements is not None:
            raise typer.BadParameter(
                "a dry run writes into a temporary folder, never measurements/",
                param_hint="--measurements",
            )
        scratch = Path(tempfile.mkdtemp(prefix="affidavit-release-dry-run-"))
        measurements = scratch / "measurements"
        build_dir = build_dir or scratch / "image"
        if release_key is None:
            throwaway = Ed25519PrivateKey.generate()
            release_key = scratch / "throwaway-release.key"
            release_key.touch(mode=0o600)
            release_key.write_bytes(
                throwaway.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
            measurements.mkdir()
            (measurements / "release.pub").write_text(public_key_text(throwaway) + "\n")
        say(f"dry run in {scratch} (a throwaway release: publish nothing from it)")
    if not version:
        raise typer.BadParameter("the release needs a version, e.g. --version 1.2.3")
    if release_key is None:
        raise typer.BadParameter(
            "the release needs the release key, kept outside the checkout (docs/release.md)",
            param_hint="--release-key",
        )
    measurements = measurements or Path("measurements")
    build_dir = build_dir or Path(".affidavit/release") / version
    try:
        cut = cut_release(
            version, release_key, measurements=measurements, build_dir=build_dir, cache=cache,
            ovmf=ovmf_file, replace=replace, say=say,
        )  # fmt: skip
    except MissingInput as exc:
        raise _missing(str(exc)) from None
    except PublishError as exc:
        print(f"affidavit: release refused: {exc}", file=sys.stderr, flush=True)
        raise typer.Exit(2) from None
    except (RuntimeError, InputError, PullError) as exc:
        print(f"affidavit: release build failed: {exc}", file=sys.stderr, flush=True)
        raise typer.Exit(1) from None
    p = cut.publication.published
    if as_json:
        doc = {
            "published": str(cut.publication.path),
            "signature": str(cut.publication.signature),
            "release_public_key": cut.publication.public_key,
            "image": str(cut.image_dir),
            "ovmf": str(cut.ovmf),
            **p.model_dump(mode="json", exclude_defaults=True),
        }
        print(json.dumps(doc, indent=2))
        return
    print(f"published    {cut.publication.path} (signature {cut.publication.signature.name})")
    print(f"release key  {cut.publication.public_key}")
    print(f"image        {cut.image_dir}  {p.image_digest}")
    print(f"weights      {p.model_weights_digest}")
    print(f"ovmf         {cut.ovmf}  {p.firmware['ovmf_sha256']}")
    print(f"launch       {p.vmm_type}, guest policy {p.guest_policy}, guest features"
          f" {p.guest_features}, {len(p.snp)} shapes of {len(RELEASE_SHAPES)}")  # fmt: skip
    for launch in p.snp:
        print(f"snp          {launch.vcpus} x {launch.vcpu_type}  {launch.measurement}")


def build(
    out: Annotated[Path, typer.Option("--out", help="the folder for the image (created)")],
    profile: Annotated[
        str, typer.Option(help="reduced (proxy + health only) or full (the appliance)")
    ] = "reduced",
    cache: Annotated[
        Path, typer.Option(help="where the pinned .deb files and wheels are kept")
    ] = Path(".affidavit/image-cache"),
    lock: Annotated[
        Path | None, typer.Option(help="the lock file (default: the one in enclave_image/)")
    ] = None,
    test_model: Annotated[
        str | None,
        typer.Option(
            "--test-model",
            metavar="tiny",
            help="full only: a TEST build with this model on the model disk instead of the"
            " release's (for QEMU test boots; `image measure` refuses it)",
        ),
    ] = None,
    epoch: Annotated[
        int | None,
        typer.Option(help="every file's mtime (default: $SOURCE_DATE_EPOCH, else 0)"),
    ] = None,
    boot: Annotated[
        bool, typer.Option("--boot", help="then boot it under QEMU (TCG) and wait for health")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Build the enclave image from the lock's pinned inputs.

    Writes vmlinuz, initrd.img, cmdline.txt, model.img + model.verity (full: app.img +
    app.verity too), model-weights.sha256 and inputs.json. The full profile's model disk
    holds the release model (SmolLM2-135M-Instruct, fetched pinned by `affidavit engine
    pull`'s sha256); --test-model tiny makes a TEST build with the tiny model instead, for
    QEMU boots under emulation. The reduced profile's boot prints 'affidavit-proxy healthy
    …'; the full one's 'affidavit-appliance ready …' (a test boot: a fresh state disk, the
    test key source, a NIC). Needs apt-get, dpkg-deb, pip and, for full, mksquashfs and the
    engine extra.
    """
    from enclave_image.build import TEST_MODELS, build_image, trial_boot_options
    from enclave_image.build import boot as boot_image
    from enclave_image.initrd import source_date_epoch
    from enclave_image.inputs import InputError
    from enclave_image.lock import LockError
    from inference.pull import PullError

    if profile not in ("reduced", "full"):
        raise typer.BadParameter(f"{profile!r}: reduced or full", param_hint="--profile")
    if test_model is not None and test_model not in TEST_MODELS:
        raise typer.BadParameter(
            f"{test_model!r}: {' or '.join(TEST_MODELS)}", param_hint="--test-model"
        )
    if test_model is not None and profile != "full":
        raise typer.BadParameter(
            "only the full profile has a model disk to put a test model on",
            param_hint="--test-model",
        )
    if lock is not None and not lock.is_file():
        raise _missing(f"lock file {lock} does not exist")
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if as_json else print
    try:
        result = build_image(
            out, cache, profile="full" if profile == "full" else "reduced",
            epoch=source_date_epoch(epoch), lock_file=lock,
            test_model="tiny" if test_model == "tiny" else None,
            say=lambda line: say(f"build: {line}"),
        )  # fmt: skip
    except LockError as exc:
        raise typer.BadParameter(str(exc), param_hint="--lock") from None
    except (RuntimeError, InputError, PullError) as exc:
        print(f"affidavit: image build failed: {exc}", file=sys.stderr, flush=True)
        raise typer.Exit(1) from None
    doc: dict[str, object] = result.json()
    if boot and profile == "full" and result.test_model is None:
        say("build: booting the release model under TCG is slow; --test-model tiny is quicker")
    if boot:
        with trial_boot_options(result) as trial:
            booted = boot_image(out, say=lambda line: say(f"console: {line}"), **trial.options)
        if trial.probe_accepted is not None:  # full: only the proxy's uid may reach the host
            doc["probe_connections"] = len(trial.probe_accepted)
        doc["health"] = booted.health
        doc["boot_seconds"] = round(booted.seconds, 1)
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        for key, value in doc.items():
            print(f"{key}: {value}")
    if boot and doc["health"] is None:
        raise typer.Exit(1)


def lock_inputs(
    cache: Annotated[Path, typer.Option(help="where the fetched inputs are kept")] = Path(
        ".affidavit/image-cache"
    ),
    out: Annotated[
        Path | None, typer.Option(help="the lock to write (default: the one in enclave_image/)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Pin every build input anew: the mirror's current Debian packages and this
    environment's wheels, each fetched into the cache and hashed; keeps the lock's OVMF.

    For whoever updates the image's inputs; commit the lock it writes.
    """
    from enclave_image.contents import lock_names
    from enclave_image.inputs import LOCK_FILE, InputError, make_lock, write_lock
    from enclave_image.lock import LockError, load_lock

    target = out or LOCK_FILE
    ovmf = None
    if target.is_file():
        try:
            ovmf = load_lock(target).ovmf
        except LockError as exc:
            raise typer.BadParameter(str(exc), param_hint="--out") from None
    try:
        debs, wheels = lock_names()
        say = (lambda line: print(line, file=sys.stderr, flush=True)) if as_json else print
        the_lock = make_lock(cache, debs, wheels, ovmf=ovmf, say=say)
    except InputError as exc:
        print(f"affidavit: {exc}", file=sys.stderr, flush=True)
        raise typer.Exit(1) from None
    write_lock(the_lock, target)
    if as_json:
        doc = {"lock": str(target), "debian": len(the_lock.debian), "wheels": len(the_lock.wheels),
               "ovmf": the_lock.ovmf is not None}  # fmt: skip
        print(json.dumps(doc, indent=2))
    else:
        print(f"wrote {target}: {len(the_lock.debian)} Debian packages, "
              f"{len(the_lock.wheels)} wheels")  # fmt: skip


def config_disk(
    out: Annotated[Path, typer.Argument(metavar="OUT", help="the disk image to write (raw)")],
    store: Annotated[
        str,
        typer.Option(
            envvar="AFFIDAVIT_STORE_URL",
            help="the record store, a postgresql:// URL (from the environment keeps a password"
            " out of the shell's history)",
        ),
    ],
    store_ca: Annotated[
        Path | None,
        typer.Option(help="PEM certificates the server's certificate must chain to"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Write an operator's config disk: attach it with serial ``affidavit-config`` and every
    appliance booted with it writes its record to that database (``docs/deploy.md``).

    The disk is outside the measurement: the published measurement stays the same for every
    operator. It holds the password, so it is written 0600."""
    from pydantic import ValidationError

    from enclave_image.appliance_config import (
        CONFIG_FORMAT,
        SERIAL,
        ConfigError,
        OperatorConfig,
        config_disk_bytes,
        parse_config,
    )

    try:
        import psycopg  # noqa: F401  (the URL is checked by libpq's own parser)
    except ImportError:
        raise _missing("checking a store URL needs the postgres extra") from None
    try:
        pem = store_ca.read_text(encoding="ascii") if store_ca is not None else None
    except (OSError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(
            f"cannot read {store_ca}: {exc}", param_hint="--store-ca"
        ) from None
    try:
        config = OperatorConfig(format=CONFIG_FORMAT, store=store, store_ca=pem)
        data = config_disk_bytes(config)
        parse_config(data)  # what the guest will check, checked before a byte is written
    except (ConfigError, ValidationError) as exc:
        print(f"affidavit: {_one_line(exc)}", file=sys.stderr, flush=True)
        raise typer.Exit(2) from None
    import os

    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as disk:
            os.fchmod(disk.fileno(), 0o600)  # an existing file: private before a byte is in it
            disk.write(data)
    except OSError as exc:
        print(f"affidavit: cannot write {out}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps({"disk": str(out), "bytes": len(data), "serial": SERIAL}))
    else:
        print(f"wrote {out} ({len(data)} bytes): attach it with serial {SERIAL}")


def _one_line(exc: Exception) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return str(exc)


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
    image_app.command("lock")(lock_inputs)
    image_app.command("measure")(measure)
    image_app.command("compare")(compare)
    image_app.command("build")(build)
    image_app.command("ovmf")(ovmf)
    image_app.command("release")(release)
    image_app.command("config-disk")(config_disk)
    return image_app
