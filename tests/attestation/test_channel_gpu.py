"""#19 lines 2, 3 and 5 with a GPU: real NVIDIA H100 evidence through the attested channel
and through the appliance's self-check.

No GPU exists here, and a real GPU's evidence signs the nonce it was asked for, once. So the
GPU's evidence is a real H100 report from ``../shared/vectors`` (nvtrust's, over NVIDIA's
real certificate chain, pinned to NVIDIA's real root), and the client's fresh nonce is made
to be the one that report signed: the one double here is the client's randomness (and the
CPU's TEE, ``channel_double.SyntheticSnp``, as everywhere in the channel's tests). Everything
else is real: the verifiers, TLS on loopback, uvicorn, ``affidavit connect``."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from affidavit.cli import main
from attestation import channel_client
from attestation.channel import Piece
from attestation.channel_client import attest
from attestation.evidence import read_trusted_roots
from attestation.self_check import GpuEvidence
from tests.attestation.channel_double import (
    Appliance,
    Inputs,
    SyntheticSnp,
    TlsServer,
    inputs,
    write_published,
)

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "attestation"
H100 = VECTORS / "nvidia-h100" / "nvtrust"
#: The nonce nvtrust's H100 report signed (its SPDM request's).
SIGNED_NONCE = bytes.fromhex("931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb")
DRIVER, VBIOS = "550.90.07", "96.00.9F.00.01"  # what that report's measurements say


def _vectors() -> tuple[bytes, str]:
    if not H100.is_dir():
        pytest.skip(
            f"{H100} is absent: the public attestation vectors live in ../shared/vectors "
            "(present in CI)"
        )
    report = bytes.fromhex((H100 / "hopperAttestationReport.hex").read_text().strip())
    return report, (H100 / "hopperCertChain.pem").read_text()


class SnpAndRealGpu(SyntheticSnp):
    """The CPU's TEE double, and beside its report the real H100 evidence (whatever the
    nonce: a real GPU would sign the one it is given, this one signed ``SIGNED_NONCE``)."""

    def collect(self, report_data: bytes, nonce: bytes) -> list[Piece]:
        report, chain = _vectors()
        gpu = Piece(kind="nvidia", evidence=base64.b64encode(report).decode(), certs=chain)
        return [*super().collect(report_data, nonce), gpu]


@dataclass
class World:
    appliance: Appliance
    server: TlsServer
    inputs: Inputs
    folder: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    _vectors()
    folder = tmp_path_factory.mktemp("channel-gpu")
    (folder / "appliance").mkdir()
    appliance = Appliance(folder / "appliance", tee=SnpAndRealGpu())
    given = inputs(folder / "inputs", appliance.tee)
    gpu = {"driver_versions": [DRIVER], "vbios_versions": [VBIOS]}
    write_published(folder / "inputs", [appliance.tee.measurement], gpu=gpu)  # re-signed
    with appliance.serve() as server:
        yield World(appliance, server, given, folder)


@pytest.fixture
def signed_nonce(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's fresh nonce is the one the real GPU signed."""
    monkeypatch.setattr(channel_client.secrets, "token_bytes", lambda n: SIGNED_NONCE[:n])


def _attest(world: World, published: Path | None = None) -> channel_client.Attested:
    return attest(
        world.server.url,
        published or world.inputs.published,
        world.inputs.policy,
        release_key=world.inputs.release_key,
        trusted=read_trusted_roots(world.inputs.trusted_root),
    )


def _failed(found: channel_client.Attested) -> list[str]:
    return [f"{v.kind}:{c.name}" for v in found.verdicts for c in v.checks if c.ok is False]


def test_real_gpu_evidence_on_our_nonce_is_verified_beside_the_cpus(
    world: World, signed_nonce: None
) -> None:
    found = _attest(world)
    assert found.ok, _failed(found)
    assert [v.kind for v in found.verdicts] == ["snp", "nvidia"]
    gpu = found.verdicts[1]
    passed = {c.name for c in gpu.checks if c.ok}
    # NVIDIA's real chain to its pinned root, the SPDM signature, our nonce, the promised state
    for name in ("report_signature", "chain.root_pinned", "channel.nonce", "published.nvidia"):
        assert name in passed, [c.line() for c in gpu.checks]
    assert gpu.facts["driver_version"] == DRIVER
    # the CPU's evidence alone binds the TLS key: the GPU's carries the nonce only
    assert "channel.tls_key" in {c.name for c in found.verdicts[0].checks if c.ok}


def test_connect_prints_the_gpu_checks(
    world: World, signed_nonce: None, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "connect",
        world.server.url,
        "--published",
        str(world.inputs.published),
        "--release-key",
        str(world.inputs.release_key),
        "--trusted-root",
        str(world.inputs.trusted_root),
        "--json",
    ]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "accept" and doc["nonce"] == SIGNED_NONCE.hex()
    gpu = {c["name"]: c["ok"] for c in doc["checks"] if c["kind"] == "nvidia"}
    assert gpu["report_signature"] and gpu["channel.nonce"] and gpu["published.nvidia"], gpu
    assert main(args[:-1]) == 0  # the text form names the GPU's checks too
    text = capsys.readouterr().out
    assert "nvidia" in text and "published.nvidia" in text, text


def test_gpu_evidence_of_another_nonce_is_refused_naming_the_gpu(world: World) -> None:
    """A fresh nonce (the client's own randomness): the real report signed another one, as a
    replayed GPU report would have."""
    found = _attest(world)
    assert not found.ok
    # the verifier's own nonce check and the channel's, both on the GPU's piece; the CPU's pass
    assert _failed(found) == ["nvidia:nonce", "nvidia:channel.nonce"], _failed(found)
    line = next(c for c in found.verdicts[1].checks if c.name == "channel.nonce").line()
    assert "the GPU's evidence carries 931d8dd0" in line, line


def test_a_gpu_in_a_state_not_published_is_refused(world: World, tmp_path: Path) -> None:
    other = write_published(
        tmp_path,
        [world.appliance.tee.measurement],
        gpu={"driver_versions": ["535.00.00"], "vbios_versions": [VBIOS]},
    )
    found = attest(
        world.server.url,
        other,
        world.inputs.policy,
        release_key=tmp_path / "release.pub",
        trusted=read_trusted_roots(world.inputs.trusted_root),
    )
    assert "nvidia:published.nvidia" in _failed(found)


def test_the_self_check_verifies_the_real_gpus_evidence() -> None:
    """Line 5: the appliance's check of its own evidence takes the GPU's; a changed byte of
    the real report fails the whole check on a ``gpu.`` check, the CPU's checks untouched."""
    from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, fake_amd
    from tests.attestation.test_self_check import _bound, _check

    report, chain = _vectors()
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    now = datetime(2025, 6, 1, tzinfo=UTC)
    good = _check(amd, _bound(amd), gpu=GpuEvidence(report, chain.encode(), SIGNED_NONCE), now=now)
    assert good.attested, good.reason
    assert any(c.name.startswith("gpu.") and c.ok for c in good.checks)
    flipped = bytearray(report)
    flipped[100] ^= 1
    bad = _check(
        amd, _bound(amd), gpu=GpuEvidence(bytes(flipped), chain.encode(), SIGNED_NONCE), now=now
    )
    assert not bad.attested and (bad.reason or "").startswith("gpu."), bad.reason
