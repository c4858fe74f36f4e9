"""Measure a built image and publish what it promises: ``measurements/<version>.json`` + ``.sig``.

An image folder (what ``affidavit image build`` writes) holds what the VMM boots directly:
``vmlinuz`` (the kernel), ``initrd.img`` and ``cmdline.txt`` (the kernel command line; one
trailing newline is dropped), and optionally
``model-weights.sha256`` (the model disk's digest: ``sha256:<hex>``, bare hex, or a
``sha256sum`` line) or else ``model.img`` (the model disk the build writes, hashed), and
``inputs.json`` (what the build took; a *test build*, ``"test_model"`` set, carries a test
model instead of the release's, and :func:`measure_image` refuses it unless told). From it
and the pinned OVMF, :func:`measure_image` computes the
SEV-SNP launch measurement for each vCPU count and type asked (``attestation.measure.
launch_digest``: QEMU, guest features 0x1, guest policy 0x30000, all three recorded in the
file) and builds the published document of ``attestation.published``;
:func:`write_published` writes it with its detached Ed25519 signature
(``attestation.published.sign_published``). :func:`compare_image` is the auditor's
direction: it recomputes the same values from a rebuilt image, with the file's VMM and guest
features, and holds them, field by field, against a published file whose signature it
checked first.

:func:`cut_release` is ``make release``: the pinned AmdSev firmware, a release build of the
full profile (never a test build), one measurement per shape of :data:`RELEASE_SHAPES`, and
the signed file, after :func:`check_release_key_file` refused a key kept in the checkout or
readable by others (``docs/release.md``).

``image_digest`` is defined here, framed so that no two different triples hash alike::

    sha256("affidavit/image/v1" 0x00
           || u64be(len(kernel)) || kernel
           || u64be(len(initrd)) || initrd
           || u64be(len(cmdline)) || cmdline (UTF-8))

The release private key is read from a file outside the repository, either PEM (PKCS#8,
unencrypted, as ``openssl genpkey -algorithm ed25519`` writes it) or base64 of the raw
32-byte seed (the form ``measurements/release.pub`` uses for the public key). This module
never generates a release key and never writes one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import stat
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.measure import VMM_TYPES, Vmm, launch_digest
from attestation.published import FORMAT, Published, load_published, sign_published
from attestation.verdict import Check
from enclave_image.lock import file_sha256

__all__ = [
    "CMDLINE",
    "GUEST_FEATURES",
    "GUEST_POLICY",
    "IMAGE_DOMAIN",
    "INITRD",
    "KERNEL",
    "MODEL_DISK",
    "RELEASE_SHAPES",
    "RELEASE_VCPUS",
    "RELEASE_VCPU_TYPES",
    "VMM_TYPE",
    "WEIGHTS",
    "ImageInputs",
    "MissingInput",
    "Publication",
    "PublishError",
    "Release",
    "TestBuildError",
    "check_release_key_file",
    "compare_image",
    "cut_release",
    "image_digest",
    "measure_image",
    "public_key_text",
    "read_image_dir",
    "read_private_key",
    "write_published",
]

KERNEL, INITRD, CMDLINE, WEIGHTS = "vmlinuz", "initrd.img", "cmdline.txt", "model-weights.sha256"
#: What the build took (``enclave_image.build``); says whether it is a test build.
INPUTS = "inputs.json"
#: What ``affidavit image build`` names the command line and the model disk.
MODEL_DISK = "model.img"
#: The domain separator of :func:`image_digest`.
IMAGE_DOMAIN = b"affidavit/image/v1\0"
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._+-]*$")
#: The vCPU counts and QEMU vCPU types every release measures (``docs/release.md``): the
#: launch digest covers one VMSA per vCPU and each VMSA holds the vCPU type's CPUID
#: signature, so each shape a host may launch needs its own published measurement.
RELEASE_VCPUS: tuple[int, ...] = (1, 2, 4, 8, 16)
RELEASE_VCPU_TYPES: tuple[str, ...] = ("EPYC-v4", "EPYC-Milan", "EPYC-Genoa", "EPYC-Turin")
RELEASE_SHAPES: tuple[tuple[int, str], ...] = tuple(
    (n, t) for t in RELEASE_VCPU_TYPES for n in RELEASE_VCPUS
)
#: The SNP launch every measurement assumes, recorded in the published file: QEMU's
#: default guest policy (SMT allowed, reserved bit 17, ABI 0.0: no debug, no migration
#: agent), QEMU's initial vCPU state, and SEV_FEATURES with SNP only.
GUEST_POLICY = 0x30000
VMM_TYPE: Vmm = "QEMU"
GUEST_FEATURES = 0x1
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


class PublishError(ValueError):
    """An image, key or argument that cannot be published, saying why."""


class MissingInput(PublishError):
    """An input file that is not there (the CLI exits 3)."""


class TestBuildError(PublishError):
    """A test build (a test model on the model disk) asked to be measured (the CLI exits 1)."""

    __test__ = False  # not a pytest class, whatever its name


@dataclass(frozen=True)
class ImageInputs:
    """What an image folder holds, read and checked."""

    kernel: Path
    initrd: Path
    cmdline: str
    weights_digest: str | None
    test_model: str | None = None  # from inputs.json: a test build's model, never a release's


@dataclass(frozen=True)
class Publication:
    """What :func:`write_published` wrote."""

    path: Path
    signature: Path
    published: Published
    public_key: str


def _file_digest(path: Path, h: hashlib._Hash) -> None:
    h.update(struct.pack(">Q", path.stat().st_size))
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)


def image_digest(kernel: Path, initrd: Path, cmdline: str) -> str:
    """``sha256:<hex>`` over the framed kernel, initrd and command line (module docstring)."""
    h = hashlib.sha256(IMAGE_DOMAIN)
    _file_digest(kernel, h)
    _file_digest(initrd, h)
    line = cmdline.encode("utf-8")
    h.update(struct.pack(">Q", len(line)) + line)
    return f"sha256:{h.hexdigest()}"


def _weights(text: str, where: str) -> str:
    words = text.split()
    token = words[0].lower() if words else ""
    token = token.removeprefix("sha256:")
    if not _HEX64.fullmatch(token):
        raise PublishError(f"{where}: {text.strip()[:80]!r} is not a sha256 digest")
    return f"sha256:{token}"


def read_image_dir(folder: Path | str) -> ImageInputs:
    """The kernel, initrd, command line and (if there) weights digest of an image folder.

    The weights digest is ``model-weights.sha256``, else the sha256 of ``model.img``, else
    None. ``test_model`` is ``inputs.json``'s (None without one).

    Raises:
        MissingInput: the folder, ``vmlinuz``, ``initrd.img`` or ``cmdline.txt`` is missing.
        PublishError: a command line with a newline or NUL inside, a bad weights digest, an
            ``inputs.json`` that is not a JSON object.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingInput(f"{folder} is not an image folder")
    paths = {name: folder / name for name in (KERNEL, INITRD, CMDLINE)}
    for path in paths.values():
        if not path.is_file():
            raise MissingInput(
                f"{path} is missing (an image folder holds {KERNEL}, {INITRD} and {CMDLINE})"
            )
    try:
        cmdline = paths[CMDLINE].read_text(encoding="utf-8").removesuffix("\n")
    except UnicodeDecodeError as exc:
        raise PublishError(f"{paths[CMDLINE]} is not UTF-8: {exc}") from None
    if "\n" in cmdline or "\0" in cmdline:
        raise PublishError(f"{paths[CMDLINE]}: the command line is one line without NUL")
    weights_file = folder / WEIGHTS
    disk = folder / MODEL_DISK
    if weights_file.is_file():
        weights: str | None = _weights(weights_file.read_text(encoding="utf-8"), str(weights_file))
    elif disk.is_file():
        weights = f"sha256:{file_sha256(disk)}"
    else:
        weights = None
    return ImageInputs(paths[KERNEL], paths[INITRD], cmdline, weights, _test_model(folder))


def _test_model(folder: Path) -> str | None:
    """``inputs.json``'s ``test_model``: a folder without the file is not marked."""
    path = folder / INPUTS
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise PublishError(f"{path} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise PublishError(f"{path} is not a JSON object")
    value = doc.get("test_model")
    return None if value is None else str(value)


def read_private_key(path: Path | str) -> Ed25519PrivateKey:
    """The Ed25519 release key in ``path``: PEM (PKCS#8, unencrypted) or base64 of 32 bytes."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise MissingInput(f"release key {path} is missing") from None
    except OSError as exc:
        raise PublishError(f"release key {path}: {exc.strerror or exc}") from None
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_private_key(data, password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ValueError(f"a {type(key).__name__}, not an Ed25519 key")
            return key
        raw = base64.b64decode(data.strip(), validate=True)
        return Ed25519PrivateKey.from_private_bytes(raw)
    except (ValueError, TypeError, binascii.Error) as exc:
        raise PublishError(
            f"release key {path}: not an Ed25519 private key (PEM, or base64 of 32 bytes): {exc}"
        ) from None


def public_key_text(key: Ed25519PrivateKey) -> str:
    """The public half as ``measurements/release.pub`` holds it: base64 of the raw 32 bytes."""
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def measure_image(
    inputs: ImageInputs,
    *,
    ovmf: Path | str,
    launches: Sequence[tuple[int, str]],
    version: str,
    weights_digest: str | None = None,
    allow_test_model: bool = False,
    guest_policy: int = GUEST_POLICY,
    vmm_type: Vmm = VMM_TYPE,
    guest_features: int = GUEST_FEATURES,
) -> Published:
    """The published document for an image: its digests and one SNP measurement per launch.

    Args:
        inputs: from :func:`read_image_dir`.
        ovmf: the pinned firmware (with the SEV kernel-hashes table: the AmdSev build).
        launches: (vCPU count, QEMU vCPU type) pairs, each measured.
        version: the release, also the file's name (letters, digits, ``._+-``).
        weights_digest: the model weights' digest when the folder has none; when both are
            given they must agree.
        allow_test_model: measure a test build anyway (never for a release).
        guest_policy, vmm_type, guest_features: the SNP launch measured, all recorded.

    Raises:
        TestBuildError: the image is a test build and ``allow_test_model`` is false.
        MissingInput: no OVMF file.
        PublishError: a bad version, no launches, no or conflicting weights digest.
        attestation.measure.MeasureError: the firmware cannot measure the kernel, a bad vCPU
            type or count.
    """
    if inputs.test_model is not None and not allow_test_model:
        raise TestBuildError(
            f"the image is a TEST build (test model {inputs.test_model!r} in its {INPUTS}): its"
            " model disk is not the release's; build without --test-model to publish, or give"
            " --allow-test-model to measure it anyway"
        )
    if not _VERSION.fullmatch(version):
        raise PublishError(f"version {version!r}: letters, digits and ._+- only")
    if not launches:
        raise PublishError("no launch to measure: give at least one vCPU count and type")
    if vmm_type not in VMM_TYPES:
        raise PublishError(f"vmm type {vmm_type!r}: one of {', '.join(VMM_TYPES)}")
    if not 0 <= guest_policy < 1 << 64:
        raise PublishError(f"guest policy {guest_policy:#x} is not a 64-bit value")
    ovmf = Path(ovmf)
    if not ovmf.is_file():
        raise MissingInput(f"ovmf {ovmf} is missing")
    given = _weights(weights_digest, "--weights-digest") if weights_digest else None
    if given and inputs.weights_digest and given != inputs.weights_digest:
        raise PublishError(
            f"--weights-digest {given} disagrees with the image's {WEIGHTS} {inputs.weights_digest}"
        )
    weights = inputs.weights_digest or given
    if weights is None:
        raise PublishError(f"the image has no {WEIGHTS}: give --weights-digest")
    snp = [
        {
            "vcpus": vcpus,
            "vcpu_type": vcpu_type,
            "measurement": launch_digest(
                ovmf,
                mode="snp",
                vcpus=vcpus,
                vcpu_type=vcpu_type,
                kernel=inputs.kernel,
                initrd=inputs.initrd,
                append=inputs.cmdline,
                guest_features=guest_features,
                vmm_type=vmm_type,
            ),
        }
        for vcpus, vcpu_type in launches
    ]
    return Published.model_validate(
        {
            "format": FORMAT,
            "version": version,
            "image_digest": image_digest(inputs.kernel, inputs.initrd, inputs.cmdline),
            "model_weights_digest": weights,
            "kernel_cmdline": inputs.cmdline,
            "firmware": {"ovmf_sha256": file_sha256(ovmf)},
            "guest_policy": f"{guest_policy:#x}",
            "vmm_type": vmm_type,
            "guest_features": f"{guest_features:#x}",
            "snp": snp,
        }
    )


def write_published(
    published: Published, out_dir: Path | str, key: Ed25519PrivateKey, *, replace: bool = False
) -> Publication:
    """Write ``<out_dir>/<version>.json`` and its ``.sig``; check them back with the key.

    Raises:
        PublishError: the file exists and ``replace`` is false (a release is not rewritten
            by accident).
    """
    out = Path(out_dir)
    path = out / f"{published.version}.json"
    sig = path.with_name(path.name + ".sig")
    if path.exists() and not replace:
        raise PublishError(f"{path} exists: a published release is not replaced (--replace)")
    doc = published.model_dump(mode="json", exclude_defaults=True)
    data = (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    out.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    sig.write_text(sign_published(data, key), encoding="ascii")
    loaded = load_published(path, key.public_key(), sig)  # what an auditor will run
    return Publication(path, sig, loaded, public_key_text(key))


def compare_image(inputs: ImageInputs, published: Published, *, ovmf: Path | str) -> list[Check]:
    """Recompute what ``published`` promises from a rebuilt image; one check per field.

    The fields: ``image_digest``, ``kernel_cmdline``, ``model_weights_digest`` (skipped when
    the image folder has no weights digest), ``firmware.ovmf_sha256`` (skipped when the file
    publishes none) and one ``snp[<vcpus> x <type>]`` per published launch, measured with
    ``ovmf`` for that vCPU count and type with the file's ``vmm_type`` and ``guest_features``
    (QEMU and 0x1 for a file from before they were recorded); a test
    build gets a ``test_model`` line first, saying so (not a check: the fields then differ
    by themselves). The caller checks the file's signature first (``load_published``).

    Raises:
        MissingInput: no OVMF file.
        attestation.measure.MeasureError: the firmware cannot measure the kernel, a vCPU type
            the measurement does not know.
    """
    ovmf = Path(ovmf)
    if not ovmf.is_file():
        raise MissingInput(f"ovmf {ovmf} is missing")

    def same(name: str, ours: str, theirs: str) -> Check:
        if ours == theirs:
            return Check(name, True, ours)
        return Check(name, False, f"rebuilt {ours}, published {theirs}")

    checks = [] if inputs.test_model is None else [
        Check(
            "test_model",
            None,
            f"the rebuilt image is a TEST build (test model {inputs.test_model}): a release"
            " never is, so its model disk and measurements cannot be a release's",
        )
    ]  # fmt: skip
    checks += [
        same(
            "image_digest",
            image_digest(inputs.kernel, inputs.initrd, inputs.cmdline),
            published.image_digest,
        ),
        same("kernel_cmdline", inputs.cmdline, published.kernel_cmdline),
    ]
    if inputs.weights_digest is None:
        checks.append(
            Check(
                "model_weights_digest",
                None,
                f"not compared: the image folder has no {WEIGHTS} or {MODEL_DISK}",
            )
        )
    else:
        checks.append(
            same("model_weights_digest", inputs.weights_digest, published.model_weights_digest)
        )
    promised_fw = published.firmware.get("ovmf_sha256")
    if promised_fw is None:
        checks.append(Check("firmware.ovmf_sha256", None, "not compared: none is published"))
    else:
        checks.append(same("firmware.ovmf_sha256", file_sha256(ovmf), promised_fw))
    vmm: Vmm = published.vmm_type or VMM_TYPE
    features = int(published.guest_features, 16) if published.guest_features else GUEST_FEATURES
    for launch in published.snp:
        ours = launch_digest(
            ovmf,
            mode="snp",
            vcpus=launch.vcpus,
            vcpu_type=launch.vcpu_type,
            kernel=inputs.kernel,
            initrd=inputs.initrd,
            append=inputs.cmdline,
            guest_features=features,
            vmm_type=vmm,
        )
        checks.append(same(f"snp[{launch.vcpus} x {launch.vcpu_type}]", ours, launch.measurement))
    if not published.snp:
        checks.append(Check("snp", None, f"not compared: {published.version} publishes none"))
    return checks


#: Where this code runs from: a release key inside it could be committed by accident.
CHECKOUT = Path(__file__).resolve().parents[1]


def check_release_key_file(path: Path | str, *, outside: Sequence[Path] = (CHECKOUT,)) -> Path:
    """The release key file, if it is kept as ``docs/release.md`` says: outside every
    folder of ``outside`` (the checkout) and readable by its owner only.

    Raises:
        MissingInput: no such file.
        PublishError: the file is inside the checkout, or group or others may read or write it.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"release key {path} is missing")
    real = path.resolve()
    for folder in outside:
        if real.is_relative_to(folder.resolve()):
            raise PublishError(
                f"release key {path} is inside the checkout {folder}: keep it outside the"
                " repository, offline (docs/release.md)"
            )
    mode = stat.S_IMODE(real.stat().st_mode)
    if mode & 0o077:
        raise PublishError(
            f"release key {path} has mode {mode:#o}: group or others may read it;"
            f" `chmod 600 {path}` (docs/release.md)"
        )
    return path


@dataclass(frozen=True)
class Release:
    """What :func:`cut_release` built, measured and wrote."""

    publication: Publication
    image_dir: Path
    ovmf: Path


def cut_release(
    version: str,
    key_file: Path,
    *,
    measurements: Path,
    build_dir: Path,
    cache: Path,
    ovmf: Path | None = None,
    replace: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> Release:
    """``make release``: check the key and the version, get the pinned AmdSev firmware,
    build the full profile (a release build: the release model, epoch 0) into
    ``build_dir``, measure every shape of :data:`RELEASE_SHAPES`, and write
    ``<measurements>/<version>.json`` and its signature.

    The key's public half must be ``<measurements>/release.pub``, the key auditors pin: a
    new key is committed there first (rotation, ``docs/release.md``).

    Raises:
        MissingInput: the key, ``release.pub`` or the firmware is missing.
        PublishError: a bad version or key, a key kept in the checkout or readable by others,
            a key that is not ``release.pub``'s, a release already published (without
            ``replace``), a firmware that is not the pinned one.
        RuntimeError, enclave_image.inputs.InputError, inference.pull.PullError: the build.
    """
    from enclave_image.build import build_image
    from enclave_image.ovmf import OVMF_SHA256, OvmfError, build_amdsev_ovmf

    if not _VERSION.fullmatch(version):
        raise PublishError(f"version {version!r}: letters, digits and ._+- only")
    outside = [CHECKOUT]
    if (measurements.resolve().parent / ".git").exists():  # another checkout's measurements/
        outside.append(measurements.resolve().parent)
    key = read_private_key(check_release_key_file(key_file, outside=outside))
    pinned_pub = measurements / "release.pub"
    if not pinned_pub.is_file():
        raise MissingInput(f"{pinned_pub} is missing: the release key's public half goes there")
    if pinned_pub.read_text(encoding="ascii").strip() != public_key_text(key):
        raise PublishError(
            f"the release key {key_file} is not the one {pinned_pub} pins ({public_key_text(key)}"
            " is its public half): rotating keys commits the new public half first"
            " (docs/release.md)"
        )
    target = measurements / f"{version}.json"
    if target.exists() and not replace:
        raise PublishError(f"{target} exists: a published release is not replaced (--replace)")
    if ovmf is None:
        say("firmware: the pinned AmdSev OVMF (built once, ~2 min, then reused)")
        try:
            ovmf = build_amdsev_ovmf(cache, expect=OVMF_SHA256).path
        except OvmfError as exc:
            raise MissingInput(f"the AmdSev OVMF: {exc}") from None
    if not ovmf.is_file():
        raise MissingInput(f"ovmf {ovmf} is missing")
    if (got := file_sha256(ovmf)) != OVMF_SHA256:
        raise PublishError(f"ovmf {ovmf} has sha256 {got}, not the pinned {OVMF_SHA256}")
    say(f"build: the full profile, a release build, into {build_dir}")
    built = build_image(
        build_dir, cache, profile="full", epoch=0, say=lambda line: say(f"build: {line}")
    )
    image = read_image_dir(built.out_dir)
    say(f"measure: {len(RELEASE_SHAPES)} shapes")
    published = measure_image(image, ovmf=ovmf, launches=RELEASE_SHAPES, version=version)
    return Release(
        write_published(published, measurements, key, replace=replace), built.out_dir, ovmf
    )
