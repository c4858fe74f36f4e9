"""Issue 8 acceptance 7 and issue 17 line 2: every command in ``docs/auditor.md`` runs, in
order, and does what the guide says it does, on the FULL profile, against a release cut the
way ``make release`` cuts one, rebuilt from a second checkout.

The test reads the guide's ```sh blocks (a line ending in ``\\`` continues on the next) and
runs each command with ``bash -euc`` in a fresh working folder. The guide's names (``$SRC``,
``$VERSION``, ``$BUNDLE``, ``$KEY``, ``$TEST_ARK``) are environment variables set from real
parts; ``-u`` makes a name the test does not set an error. Each command must match the next
entry of :data:`EXPECTED` (its leading words, its exit code, the lines it must print), so a
guide command that is changed, dropped or added without the test fails it; that agreement
is also checked without a build, in ``make test``.

What is real (``make test-long``: two full builds, ~15 min on 2 cores):

- The release: ``make release``'s own command line, read from ``make -n release`` (so the
  Makefile's recipe is what runs), from this checkout, with a throwaway key kept outside it
  at mode 600: the pinned AmdSev firmware, a release build of the full profile (the release
  model, never ``--test-model``), one SNP launch digest per shape of the release table, the
  signed file.
- The auditor: a second checkout (``checkouts.second_checkout``, another path) holding the
  release's published file and signature in ``measurements/`` as a tag would, and its own
  venv (``checkouts.second_venv``) whose ``affidavit`` runs that checkout's code. The
  guide's firmware step, its full build and its comparison run there: step 4 only matches
  when the two full builds, from two checkouts and two interpreters, are byte-identical.
- A running appliance (the real proxy, control plane and record, no engine needed) whose
  session keeps the evidence through ``affidavit attest collect``; the exported bundle.

What is not, and why (the guide says the same):

- The SEV-SNP report is a test double: a synthetic version-5 report signed by a throwaway
  ARK → ASK → VCEK chain (``tests/attestation/snp_double.py``), whose MEASUREMENT is the one
  the release published for 4 × EPYC-v4, whose guest policy is the published one, and whose
  report_data binds the appliance's real log key and sealing key. No TEE exists here.
- The AMD-root problem. AMD's pinned roots rightly reject that chain, so the guide's steps
  5 and 6, run verbatim, must exit 1; the test asserts exactly which check fails
  (``chain.ark_pinned``, and bind-check's ``evidence`` line that reports it) and that every
  other check, the published measurement, the guest policy and the binding included,
  passes. It then runs the guide's rehearsal commands, the same two with ``--trusted-root
  $TEST_ARK`` (the test chain's ARK), and asserts that they accept AND that the output says,
  as a ``skip trust.amd_roots: NOT checked`` line, that AMD's roots were replaced.
- The caches are warm: the working folder's ``.affidavit/image-cache`` is a symlink to this
  checkout's, where ``make ovmf`` built the firmware (the release command builds it, ~2 min,
  when it is not there) and the pinned packages are kept.

Negative checks: the guide's compare command on a rebuilt image with one flipped initrd
byte exits 1 naming ``image_digest`` and every SNP shape; on a published file with one
changed byte it exits 1 at the signature; without the firmware it exits 3.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from affidavit.cli import main
from attestation.binding import report_data
from attestation.certs import load_certs
from attestation.published import load_published, read_public_key
from enclave_image.ovmf import OVMF_FILE, OVMF_SHA256
from enclave_image.publish import RELEASE_SHAPES, public_key_text
from harness.state import Home
from record.bundle import export_stream
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, fake_amd, v5_report
from tests.enclave_image.checkouts import second_checkout, second_venv

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "auditor.md"
CACHE = REPO / ".affidavit" / "image-cache"
BIN = REPO / ".venv" / "bin"
VERSION = "0.0.0-audit"
LAUNCH = ("4", "EPYC-v4")  # the shape the evidence double was launched with


@dataclass
class Step:
    """What the next guide command must be: its leading words, exit code, and lines."""

    starts: str
    exit: int
    lines: list[str] = field(default_factory=list)  # regexes, each must match some line
    exact_fails: list[str] | None = None  # the FAIL check names, exactly (None: not checked)


#: The guide's commands, in order. A FAIL list of ``[]`` means no check may fail.
EXPECTED = [
    Step("cat ", 0, [r"^[A-Za-z0-9+/]{43}=$"]),
    Step("affidavit image ovmf", 0, [rf"^ovmf .*/{OVMF_FILE}$", rf"^sha256  {OVMF_SHA256} "]),
    Step("grep ", 0, [rf'"ovmf_sha256": "{OVMF_SHA256}"']),
    Step(
        "affidavit image build --profile full",
        0,
        [r"^profile: full$", r"^test_model: None$", r"^app: .*app\.img$"],
    ),
    Step(
        "affidavit image compare",
        0,
        [
            r"^ok   signature: .* is signed by the release key",
            r"^ok   image_digest: sha256:[0-9a-f]{64}$",
            r"^ok   kernel_cmdline: console=ttyS0 .*dm-mod\.create=",
            r"^ok   model_weights_digest: sha256:[0-9a-f]{64}$",
            rf"^ok   firmware\.ovmf_sha256: {OVMF_SHA256}$",
            *(rf"^ok   snp\[{n} x {t}\]: [0-9a-f]{{96}}$" for n, t in RELEASE_SHAPES),
            rf"^match: the rebuilt image is what {VERSION} publishes$",
        ],
        exact_fails=[],
    ),
    Step(
        "affidavit attest verify --kind snp",
        1,
        [
            r"^ok   report_signature: ",
            r"^ok   chain\.ask_by_ark",
            r"^ok   chain\.vek_by_ask",
            r"^FAIL chain\.ark_pinned: .* is none of the pinned roots \(Genoa, Milan, Turin\)$",
            r"^ok   published\.signature: ",
            rf"^ok   published\.snp: measurement matches {VERSION} \(4 × EPYC-v4\)$",
            rf"^ok   published\.guest_policy: guest policy 0x30000 is the one {VERSION} publishes$",
            r"^skip chain\.revocation: no CRL given \(--crl\): revocation was not checked$",
            r"^verdict: REJECT \(1 not checked: see the skip lines\)$",
        ],
        exact_fails=["chain.ark_pinned"],
    ),
    Step(
        "affidavit attest bind-check",
        1,
        [
            r"^ok   bundle: \d+ entries and the checkpoints verify under affidavit",
            r"^FAIL evidence\.snp-.*\.report: FAIL chain\.ark_pinned: [^;]*$",
            r"^ok   binding\.snp-.*\.report: report_data binds the log key and sealing key ",
            r"^verdict: REJECT$",
        ],
        exact_fails=["evidence"],
    ),
    Step(
        "affidavit log verify",
        0,
        [r"^ok: .*: \d+ entries in 1 stream, no problem$"],
        exact_fails=[],
    ),
    Step(
        "affidavit attest verify --kind snp",
        0,
        [
            r"^skip trust\.amd_roots: NOT checked: the chain was held to --trusted-root ",
            r"^ok   chain\.ark_pinned: .* is the --trusted-root Turin root ",
            rf"^ok   published\.snp: measurement matches {VERSION} ",
            r"^ok   published\.guest_policy: guest policy 0x30000 ",
            r"^skip chain\.revocation: no CRL given \(--crl\): revocation was not checked$",
            r"^verdict: accept \(2 not checked: see the skip lines\)$",
        ],
        exact_fails=[],
    ),
    Step(
        "affidavit attest bind-check",
        0,
        [
            r"^skip trust\.amd_roots: NOT checked: ",
            r"^ok   evidence\.snp-.*\.report: verified at its collection time ",
            r"^ok   binding\.snp-.*\.report: ",
            r"^verdict: accept$",
        ],
        exact_fails=[],
    ),
]


def guide_commands(text: str) -> list[str]:
    """Every command in the ```sh blocks of ``text``, continuation lines joined."""
    commands: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M):
        pending = ""
        for line in block.splitlines():
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1]
                continue
            commands.append((pending + line).strip())
            pending = ""
        assert not pending, f"a ```sh block ends in a continuation: {pending!r}"
    return commands


@dataclass
class Audit:
    """What the guide's names stand for, and the folders and programs around them."""

    env: dict[str, str]
    root: Path
    cache: Path
    path: str = ""  # where the guide's `affidavit` is found: the second checkout's venv
    pythonpath: str = ""  # the second checkout's code


def _need() -> str | None:
    for tool in ("apt-get", "dpkg-deb", "mksquashfs", "bash", "make", "git"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make system-deps)"
    if not (BIN / "affidavit").is_file():
        return f"{BIN / 'affidavit'} is missing (make dev)"
    return None


def release_command(key: Path, measurements: Path, build: Path) -> str:
    """``make release``'s command line for this release, as ``make -n`` prints it."""
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "release", f"VERSION={VERSION}",
         f"RELEASE_KEY={key}", f"RELEASE_MEASUREMENTS={measurements}", f"RELEASE_BUILD={build}"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    (line,) = re.findall(r"^\S*affidavit image release .*$", done.stdout, flags=re.M)
    return line


def _throwaway_key(where: Path) -> Ed25519PrivateKey:
    """A release key as docs/release.md keeps one: outside the checkout, mode 600."""
    key = Ed25519PrivateKey.generate()
    where.parent.mkdir(parents=True, exist_ok=True)
    where.touch(mode=0o600)
    where.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    assert stat.S_IMODE(where.stat().st_mode) == 0o600
    return key


def _auditor_affidavit(venv_python: Path) -> Path:
    """The second venv's ``affidavit`` console script, as pip writes one: its interpreter runs
    ``affidavit.cli`` from ``PYTHONPATH``, the second checkout."""
    script = venv_python.parent / "affidavit"
    script.write_text(
        f"#!{venv_python}\nimport sys\nfrom affidavit.cli import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    return script


@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Audit]:
    """The release (make release's command, a throwaway key), the second checkout holding its
    published file as a tag would, then an appliance that keeps SNP evidence of that
    measurement in a session, and its bundle."""
    reason = _need()
    if reason is not None:
        print(f"auditor guide test skipped: {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("audit")
    cache = CACHE  # builds sharing it are safe: each builds our wheel in its own folder
    cache.mkdir(parents=True, exist_ok=True)
    # the auditor's source first: the same files the release is about to be built from
    src = second_checkout(root / "elsewhere" / "deeper" / "src")

    # the release: make release's own command (the maintainer's side, not the guide's)
    key_file = root / "keys" / "release.pem"
    key = _throwaway_key(key_file)
    released = root / "release" / "measurements"
    released.mkdir(parents=True)
    (released / "release.pub").write_text(public_key_text(key) + "\n")
    command = release_command(key_file, released, root / "release" / "image")
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    done = subprocess.run(
        ["bash", "-euc", command], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=2400, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"$ {command}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    print(done.stdout[-3000:])
    # what a maintainer commits, and the key an auditor's checkout pins
    for name in (f"{VERSION}.json", f"{VERSION}.json.sig", "release.pub"):
        shutil.copyfile(released / name, src / "measurements" / name)
    published = load_published(
        src / "measurements" / f"{VERSION}.json",
        read_public_key(src / "measurements" / "release.pub"),
    )
    assert {(s.vcpus, s.vcpu_type) for s in published.snp} == set(RELEASE_SHAPES)
    assert (published.guest_policy, published.vmm_type, published.guest_features) == (
        "0x30000", "QEMU", "0x1",
    )  # fmt: skip
    (measurement,) = [
        s.measurement
        for s in published.snp
        if (str(s.vcpus), s.vcpu_type) == LAUNCH
    ]  # fmt: skip

    # the appliance: real proxy, control plane and record; the TEE is the test double
    from harness.session import open_session
    from harness.up import running_appliance

    home = Home(root / "home")
    chain = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    provider = {"api": "openai", "base_url": "http://127.0.0.1:9"}  # never called here
    with running_appliance(home, provider=provider, model="none") as up:
        session = open_session(home, None).session_id
        store = SQLiteStore(up.appliance.store, readonly=True)
        try:
            log_key = store.get_meta("log_key")
        finally:
            store.close()
        assert log_key is not None
        sealing = KeyPair.read(home.root / "appliance.key").recipient.public.public_bytes_raw()
        report = v5_report(
            chain.vek_key,
            measurement=bytes.fromhex(measurement),
            report_data=report_data(log_key, sealing, bytes(range(32))),
            policy=int(published.guest_policy or "0", 16),  # the published one: no debug
        )
        (root / "report.bin").write_bytes(report)
        vek_pem = load_certs(chain.vek)[0].public_bytes(serialization.Encoding.PEM)
        (root / "certs.pem").write_bytes(vek_pem + chain.chain)  # VCEK, ASK, ARK
        collect = ["attest", "collect", session, "--kind", "snp", "--home", str(home.root)]
        collect += ["--evidence", str(root / "report.bin"), "--certs", str(root / "certs.pem")]
        assert main(collect) == 0
        assert main(["log", "checkpoint", session, "--store", str(up.appliance.store)]) == 0
        bundle = root / "bundle"
        export_stream(up.appliance.store, session, bundle)

    ark = next(c for c in load_certs(chain.chain) if c.subject == c.issuer)
    (root / "test-ark.pem").write_bytes(ark.public_bytes(serialization.Encoding.PEM))
    names = {
        "SRC": str(src),
        "VERSION": VERSION,
        "BUNDLE": str(bundle),
        "KEY": str(home.user_key_file),
        "TEST_ARK": str(root / "test-ark.pem"),
    }
    auditor = _auditor_affidavit(second_venv(root / "auditor-venv"))
    yield Audit(names, root, cache, path=str(auditor.parent), pythonpath=str(src))


def run_command(command: str, audit: Audit, cwd: Path) -> subprocess.CompletedProcess[str]:
    drop = ("SOURCE_DATE_EPOCH", "AFFIDAVIT_HOME", "VIRTUAL_ENV", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(audit.env)
    env["PATH"] = f"{audit.path}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = audit.pythonpath
    return subprocess.run(
        ["bash", "-euc", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=2400,
        check=False,
    )


def _work(audit: Audit, name: str, *, cache: bool = True) -> Path:
    work = audit.root / name
    (work / ".affidavit").mkdir(parents=True)
    if cache:
        (work / ".affidavit" / "image-cache").symlink_to(audit.cache, target_is_directory=True)
    return work


def _fails(out: str) -> list[str]:
    names = [m.group(1) for m in re.finditer(r"^FAIL ([^:\s]+)", out, flags=re.M)]
    return [n.split(".")[0] if n.startswith("evidence.") else n for n in names]


def _check(step: Step, command: str, done: subprocess.CompletedProcess[str]) -> None:
    said = f"$ {command}\n(exit {done.returncode})\n{done.stdout}\n{done.stderr}"
    assert command.startswith(step.starts), f"the guide's command is not `{step.starts} …`:\n{said}"
    assert done.returncode == step.exit, said
    lines = done.stdout.splitlines()
    for pattern in step.lines:
        assert any(re.search(pattern, line) for line in lines), f"no line /{pattern}/:\n{said}"
    if step.exact_fails is not None:
        assert _fails(done.stdout) == step.exact_fails, said


def _guide() -> list[str]:
    return guide_commands(GUIDE.read_text())


def test_the_guide_commands_are_the_ones_the_long_test_checks() -> None:
    """In ``make test``: a guide command changed, dropped or added without the long test
    fails here already, and the guide builds the full profile, never a test build."""
    commands = _guide()
    assert len(commands) == len(EXPECTED), "\n".join(commands)
    for step, command in zip(EXPECTED, commands, strict=True):
        assert command.startswith(step.starts), (step.starts, command)
    assert "--test-model" not in "\n".join(commands)
    names = set(re.findall(r"\$\{?([A-Z_]+)", "\n".join(commands)))
    assert names == {"SRC", "VERSION", "BUNDLE", "KEY", "TEST_ARK"}, names


@pytest.mark.long
@pytest.mark.timeout(5400)
def test_every_command_in_the_auditor_guide_runs_and_says_what_the_guide_says(
    audit: Audit,
) -> None:
    commands = _guide()
    assert len(commands) == len(EXPECTED), "\n".join(commands)
    names = set(re.findall(r"\$\{?([A-Z_]+)", "\n".join(commands)))
    assert names == set(audit.env), (
        f"the guide uses {sorted(names)}, the test sets {sorted(audit.env)}"
    )
    work = _work(audit, "work")
    for step, command in zip(EXPECTED, commands, strict=True):
        done = run_command(command, audit, work)
        _check(step, command, done)
        print(f"$ {command[:100]}  -> exit {done.returncode}")
    # the key the guide prints is the key that signed the published file
    first = run_command(commands[0], audit, work).stdout.strip()
    assert first == (Path(audit.env["SRC"]) / "measurements/release.pub").read_text().strip()
    # the guide's `affidavit` was the second checkout's, started by the second venv
    where = run_command(
        "affidavit --help >/dev/null && command -v affidavit && head -1 \"$(command -v affidavit)\"",
        audit, work,
    )  # fmt: skip
    assert where.stdout.splitlines()[0].startswith(audit.path), where.stdout
    assert str(BIN) not in where.stdout, where.stdout

    # negative: one flipped initrd byte in the rebuilt image
    (compare,) = [c for c in commands if c.startswith("affidavit image compare")]
    bad = _work(audit, "tampered")
    (bad / "rebuilt").mkdir()
    for part in (work / "rebuilt").iterdir():  # not the disks: compare reads their digests
        if not part.name.endswith((".img", ".verity")) or part.name == "initrd.img":
            shutil.copyfile(part, bad / "rebuilt" / part.name)
    initrd = bad / "rebuilt" / "initrd.img"
    data = bytearray(initrd.read_bytes())
    data[len(data) // 2] ^= 0x01
    initrd.write_bytes(bytes(data))
    done = run_command(compare, audit, bad)
    assert done.returncode == 1, done.stdout + done.stderr
    shapes = [f"snp[{n}" for n, _ in RELEASE_SHAPES]
    assert _fails(done.stdout) == ["image_digest", *shapes], done.stdout
    assert "ok   kernel_cmdline" in done.stdout and "MISMATCH" in done.stdout

    # negative: a published file with one changed byte is not believed at all
    forged = audit.root / "forged"
    shutil.copytree(Path(audit.env["SRC"]) / "measurements", forged / "measurements")
    doc = forged / "measurements" / f"{VERSION}.json"
    doc.write_text(doc.read_text().replace('"vcpus": 4', '"vcpus": 5', 1))
    done = run_command(compare, Audit({**audit.env, "SRC": str(forged)}, audit.root,
                                      audit.cache, audit.path, audit.pythonpath), work)  # fmt: skip
    assert done.returncode == 1
    assert _fails(done.stdout) == ["signature"], done.stdout
    assert "image_digest" not in done.stdout

    # usage: a working folder without the firmware: "missing" (3)
    bare = _work(audit, "no-firmware", cache=False)
    (bare / "rebuilt").symlink_to(work / "rebuilt", target_is_directory=True)
    done = run_command(compare, audit, bare)
    assert done.returncode == 3 and "missing" in done.stderr, done.stderr


def test_the_guide_parser_reads_continuations_and_skips_comments() -> None:
    text = "x\n```sh\n# a comment\naffidavit a \\\n  --b c\n\naffidavit d\n```\n```text\nno\n```\n"
    assert guide_commands(text) == ["affidavit a   --b c", "affidavit d"]
    assert shlex.split(guide_commands(text)[0]) == ["affidavit", "a", "--b", "c"]
