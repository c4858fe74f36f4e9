"""The full profile's guest program (``enclave_image.appliance``), its pieces run on the host.

Real parts throughout: the supervisor starts and restarts real processes; the health test
runs the real engine (a test build's model disk: the tiny model), the proxy runner and the
harness panel on loopback
under this uid and waits for the ready line; the ruleset is loaded with ``nft`` into a
network namespace of the test's own and probed as uid 1003 and 1001 (root only); the state
disk is formatted with ``cryptsetup`` in a file. The one double is the TEE: no SEV-SNP
here, so ``snp`` is tested against a device that is not ``/dev/sev-guest`` (the ioctl is
refused) and the struct layouts against the uapi header's numbers. What a container cannot
do (device-mapper, for ``cryptsetup open``) is left to the full image's boots.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from enclave_image import appliance_tee as tee
from enclave_image.appliance import (
    BootOptions,
    GuestLayout,
    Refused,
    main,
    parse_cmdline,
)
from enclave_image.appliance_disk import DiskError, StateDisk
from enclave_image.appliance_supervise import Service, Supervisor, WeeklyTimer
from tests.attestation.kds_double import StandInKds, stand_in_kds
from tests.enclave_image.host_guest import boot, host_layout

REPO = Path(__file__).resolve().parents[2]


def _skip(reason: str) -> None:
    print(f"test_appliance: skipped: {reason}", file=sys.stderr)
    pytest.skip(reason)


# -- the kernel command line -----------------------------------------------------------------


def test_cmdline_reads_the_affidavit_words() -> None:
    line = (
        'console=ttyS0 panic=-1 dm-mod.create="vroot,,,ro,0 8 verity 1 /dev/vda /dev/vdb 4096"'
        " affidavit.state=/dev/vde affidavit.keysource=snp affidavit.probe=10.0.2.2:9999"
        " affidavit.selftest=turn\n"
    )
    assert parse_cmdline(line) == BootOptions(Path("/dev/vde"), "snp", ("10.0.2.2", 9999), True)
    plain = parse_cmdline("affidavit.state=/dev/vde affidavit.keysource=test-insecure")
    assert plain == BootOptions(Path("/dev/vde"), "test-insecure", None, False)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("affidavit.keysource=snp", "no affidavit.state"),
        ("affidavit.state=/dev/vde", "no affidavit.keysource"),
        ("affidavit.state=/dev/vde affidavit.keysource=", "not one of snp|test-insecure"),
        ("affidavit.state=/dev/vde affidavit.keysource=tpm", "not one of snp|test-insecure"),
        ("affidavit.state=/dev/vde affidavit.keysource=snp affidavit.probe=host:1", "IPV4:PORT"),
        ("affidavit.state=/dev/vde affidavit.keysource=snp affidavit.probe=1.2.3.4", "IPV4:PORT"),
        ("affidavit.state=/dev/vde affidavit.keysource=snp affidavit.selftest=all", "`turn`"),
    ],
)
def test_cmdline_refusals(line: str, why: str) -> None:
    with pytest.raises(Refused, match=why):
        parse_cmdline(line)


def test_main_refuses_to_start_without_a_key_source(tmp_path: Path) -> None:
    cmdline = tmp_path / "cmdline"
    cmdline.write_text("console=ttyS0 affidavit.state=/dev/vde\n")
    said: list[str] = []
    assert main(GuestLayout(cmdline=cmdline), said.append) == 2
    assert said == [
        "appliance: refusing to start: no affidavit.keysource= on the kernel command line"
        " (snp|test-insecure)"
    ]


# -- the TEE -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "family, model, product",
    [("25", "1", "Milan"), ("25", "17", "Genoa"), ("25", "160", "Genoa"), ("26", "2", "Turin"),
     ("6", "143", None), ("25", "x", None), (None, None, None)],
)  # fmt: skip
def test_the_cpu_product_comes_from_the_first_processors_cpuid(
    tmp_path: Path, family: str | None, model: str | None, product: str | None
) -> None:
    """What KDS is asked about when the report (version 2) names no product."""
    from enclave_image.appliance import cpu_product

    info = tmp_path / "cpuinfo"
    first = (
        f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: {model}\n"
    )
    second = "\nprocessor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\n"
    info.write_text(first + second if family is not None else "processor\t: 0\n" + second)
    assert cpu_product(info) == product
    assert cpu_product(tmp_path / "absent") is None


def test_ioctl_structs_match_the_uapi_header() -> None:
    """Sizes and offsets of include/uapi/linux/sev-guest.h on x86-64, and the _IOWR numbers."""
    assert ctypes.sizeof(tee.SnpReportReq) == 96
    assert tee.SnpReportReq.vmpl.offset == 64 and tee.SnpReportReq.rsvd.offset == 68
    assert ctypes.sizeof(tee.SnpReportResp) == 4000
    assert ctypes.sizeof(tee.SnpDerivedKeyReq) == 32
    offsets = {
        name: getattr(tee.SnpDerivedKeyReq, name).offset
        for name in ("root_key_select", "rsvd", "guest_field_select", "vmpl", "guest_svn")
    }
    assert offsets == {
        "root_key_select": 0,
        "rsvd": 4,
        "guest_field_select": 8,
        "vmpl": 16,
        "guest_svn": 20,
    }
    assert tee.SnpDerivedKeyReq.tcb_version.offset == 24
    assert ctypes.sizeof(tee.SnpDerivedKeyResp) == 64
    assert ctypes.sizeof(tee.SnpGuestRequestIoctl) == 32
    assert tee.SnpGuestRequestIoctl.req_data.offset == 8
    assert tee.SnpGuestRequestIoctl.resp_data.offset == 16
    assert tee.SnpGuestRequestIoctl.exitinfo2.offset == 24
    assert tee.SNP_GET_REPORT == 0xC0205300
    assert tee.SNP_GET_DERIVED_KEY == 0xC0205301
    assert tee.DISK_KEY_FIELDS == 0b1001  # guest policy and measurement, not TCB or SVN


def test_key_sources(tmp_path: Path) -> None:
    assert tee.disk_key("test-insecure", tmp_path / "none") == tee.TEST_INSECURE_KEY
    assert len(tee.TEST_INSECURE_KEY) == 32
    with pytest.raises(tee.TeeError, match="does not exist"):
        tee.disk_key("snp", tmp_path / "sev-guest")
    # The TEE double: a device that is not the SNP guest driver refuses the ioctl.
    with pytest.raises(tee.TeeError, match="SNP_GET_DERIVED_KEY on /dev/null failed"):
        tee.disk_key("snp", Path("/dev/null"))
    with pytest.raises(tee.TeeError, match="SNP_GET_REPORT on /dev/null failed"):
        tee.snp_report(Path("/dev/null"), bytes(64))


# -- the supervisor and the timer ------------------------------------------------------------


def _py(name: str, code: str) -> Service:
    return Service(name, (sys.executable, "-u", "-c", code), env=dict(os.environ))


def _until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_supervisor_restarts_a_crashed_service_and_runs_jobs() -> None:
    said: list[str] = []
    sup = Supervisor(said.append, backoff=(0.05, 0.1), stable_s=60)
    sup.start_reaper(tick=0.02)
    try:
        sup.start(_py("steady", "import time; print('up'); time.sleep(60)"))
        sup.start(_py("crashy", "print('boom'); raise SystemExit(3)"))
        _until(lambda: sup.restarts["crashy"] >= 2)
        steady = sup.pid("steady")
        assert steady is not None and sup.restarts["steady"] == 0
        job = sup.run(_py("job", "print('one'); print('two'); raise SystemExit(4)"), 30)
        assert (job.returncode, job.lines) == (4, ["one", "two"])
        os.kill(steady, 9)  # a service killed from outside comes back too
        _until(lambda: sup.restarts["steady"] == 1)
    finally:
        sup.stop_all(timeout=5)
    assert "[steady] up" in said and "[crashy] boom" in said
    assert "supervisor: crashy exit 3; restarting in 0.05 s" in said
    assert "supervisor: steady killed by SIGKILL; restarting in 0.05 s" in said
    assert any(line.startswith("supervisor: steady stopped (killed by SIGTERM)") for line in said)
    assert sup.pid("steady") is None


def test_weekly_timer_keeps_its_schedule_across_restarts(tmp_path: Path) -> None:
    clock = [datetime(2025, 6, 2, 8, 0, tzinfo=UTC)]
    ran: list[datetime] = []
    state = tmp_path / "timer.json"

    def timer() -> WeeklyTimer:
        return WeeklyTimer(state, lambda: ran.append(clock[0]), now=lambda: clock[0])

    assert timer().next_due() == datetime(2025, 6, 9, 8, 0, tzinfo=UTC)
    clock[0] += timedelta(days=6, hours=23)
    assert not timer().tick() and ran == []  # a reboot keeps the due time
    clock[0] += timedelta(hours=2)  # overdue: runs at the first tick
    t = timer()
    assert t.tick() and ran == [clock[0]]
    assert t.next_due() == clock[0] + timedelta(days=7)
    assert not t.tick()


# -- the state disk ---------------------------------------------------------------------------


def test_state_disk_luks_header(tmp_path: Path) -> None:
    if shutil.which("cryptsetup") is None:
        _skip("needs cryptsetup (Debian package cryptsetup-bin)")
    disk = StateDisk(tmp_path / "state.img", tmp_path / "mnt", cryptsetup="cryptsetup")
    with pytest.raises(DiskError, match="does not exist"):
        disk.is_luks()
    (tmp_path / "state.img").write_bytes(bytes(32 << 20))
    assert not disk.is_luks()
    key = secrets.token_bytes(32)
    disk.format(key)
    assert disk.is_luks()
    assert disk.key_opens(key) and not disk.key_opens(tee.TEST_INSECURE_KEY)
    with pytest.raises(DiskError, match="does not open with this image's key"):
        StateDisk(disk.device, cryptsetup="cryptsetup").prepare(tee.TEST_INSECURE_KEY)
    # Opening it for real needs the kernel's device-mapper, which a CI container lacks: the
    # full image's boots (`make image-full`) open and mount it inside the guest.


# -- network rules ------------------------------------------------------------------------------


@pytest.fixture
def netns() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0:
        _skip("the ruleset test needs root (network namespaces, uid switching)")
    if shutil.which("ip") is None or shutil.which("nft") is None:
        _skip("needs `ip` and `nft` (Debian packages iproute2 and nftables)")
    tag = secrets.token_hex(3)
    guest, world = f"aff-g-{tag}", f"aff-x-{tag}"
    made: list[str] = []

    def sh(*argv: str, ns: str | None = None) -> None:
        prefix = ["ip", "netns", "exec", ns] if ns else []
        done = subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")

    try:
        for ns in (guest, world):
            try:
                sh("ip", "netns", "add", ns)
            except RuntimeError as exc:
                _skip(f"`ip netns add` is not permitted here: {exc}")
            made.append(ns)
        sh(
            "ip",
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            "w0",
            "netns",
            world,
            ns=guest,
        )
        sh("ip", "addr", "add", "10.0.2.15/24", "dev", "eth0", ns=guest)
        sh("ip", "addr", "add", "10.0.2.2/24", "dev", "w0", ns=world)
        for ns, dev in ((guest, "eth0"), (world, "w0")):
            sh("ip", "link", "set", "lo", "up", ns=ns)
            sh("ip", "link", "set", dev, "up", ns=ns)
        yield guest, world
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def test_only_the_proxy_uid_leaves_the_machine(netns: tuple[str, str]) -> None:
    guest, world = netns
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        _skip("the probe runs as uid 1001/1003: needs a /usr/bin/python3 they may execute")
    listener = subprocess.Popen(
        ["ip", "netns", "exec", world, sys.executable, "-c",
         "import socket\ns = socket.create_server(('10.0.2.2', 9999)); print('ready', flush=True)\n"
         "while True: s.accept()[0].close()"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        code = (
            "import json, sys\n"
            "from enclave_image.appliance import GuestLayout, network_rules\n"
            "said = []\n"
            f"layout = GuestLayout(nft='nft', python={python!r})\n"
            "network_rules(layout, ('10.0.2.2', 9999), said.append)\n"
            "print(json.dumps(said))\n"
        )
        done = subprocess.run(
            ["ip", "netns", "exec", guest, sys.executable, "-c", code],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        said = json.loads(done.stdout.splitlines()[-1])
    finally:
        listener.kill()
        listener.wait()
    assert said[0] == (
        "netrules: loaded table inet affidavit_harness: only uid 1001 may leave the machine"
    )
    assert said[1] == (
        "netrules: loopback: uid 0 reaches every port, uid 1001 only 8000 (the engine), any"
        " other uid only 8700 (the rest refused)"
    )
    assert said[2].startswith("netrules: uid 1003 -> 10.0.2.2:9999 blocked (")
    assert said[3] == "netrules: uid 1001 -> 10.0.2.2:9999 connected"


# -- the whole appliance on loopback ------------------------------------------------------------


@pytest.fixture
def kds() -> Iterator[StandInKds]:
    with stand_in_kds() as stand_in:
        yield stand_in


def _panel_through_the_front(front: str, said: list[str]) -> None:
    printed = next(x for x in said if x.startswith("[harness] affidavit panel: "))
    token = printed.rsplit("?token=", 1)[1]
    assert "/panel/?token=" in printed  # served under the root the front relays
    with httpx.Client(verify=False, timeout=30) as client:
        assert client.get(f"{front}/panel/").status_code == 401
        signed = client.get(f"{front}/panel/?token={token}")
        assert signed.status_code == 303 and signed.headers["location"] == "/panel/"
        assert "Secure" in signed.headers["set-cookie"]
        assert "Path=/panel;" in signed.headers["set-cookie"]
        page = client.get(f"{front}/panel/")
        assert page.status_code == 200 and 'href="/panel/static/panel.css"' in page.text
        target = f"{front}/panel/s/no-such-stream/calls/verify"
        assert client.post(target, headers={"origin": "https://elsewhere"}).status_code == 403
        own = client.post(target, headers={"origin": front})
        assert own.status_code == 404  # past the guard: the panel looked for the stream
        # the data plane is still the proxy's at the same address
        assert client.get(f"{front}/metrics").status_code == 404


def test_ready_line_only_after_the_services_answer(tmp_path: Path, kds: StandInKds) -> None:
    from attestation.binding import binding_digest
    from enclave_image.build import model_tree
    from record.sqlite_store import SQLiteStore

    model_tree(tmp_path / "model", test_model="tiny")  # the disk a test build ships
    layout = host_layout(tmp_path, kds_url=kds.url)
    engine, proxy, harness, tls = (
        layout.engine_port, layout.proxy_port, layout.harness_port, layout.tls_port,
    )  # fmt: skip
    # no TEE here: the self-check fails, and only the override lets the pinned turn run
    options = BootOptions(tmp_path / "disk", "test-insecure", selftest=True, allow_unattested=True)
    booted = boot(layout, options)
    said = booted.said
    try:
        assert booted.selftest.wait(90), "\n".join(said)
        urls = {
            "engine": f"http://127.0.0.1:{engine}/v1/models",
            "proxy": f"http://127.0.0.1:{proxy}/metrics",
        }
        import urllib.error
        import urllib.request

        # The engine answers only the token of this boot, which the proxy holds (0600).
        token_file = layout.token_file("proxy")
        assert token_file.stat().st_mode & 0o777 == 0o600
        bearer = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urls["engine"], timeout=10)
        assert refused.value.code == 401
        for url in urls.values():
            request = urllib.request.Request(url, headers=bearer)
            with urllib.request.urlopen(request, timeout=10) as reply:
                assert reply.status == 200
        # The external TLS port: no TEE to ask here, so /attestation says so (503 no_tee)
        import ssl

        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with pytest.raises(urllib.error.HTTPError) as no_tee:
            urllib.request.urlopen(
                f"https://127.0.0.1:{tls}/attestation?nonce={'00' * 32}", context=context
            )
        assert no_tee.value.code == 503 and b'"no_tee"' in no_tee.value.read()
        # The panel, in its own process under /panel, reached through the same TLS port: it
        # sees the browser's https origin (the front forwards Host and the scheme), so its
        # cookie is Secure and its own POSTs pass the cross-site guard.
        _panel_through_the_front(f"https://127.0.0.1:{tls}", said)
        # What an SNP guest does with its report (the TEE is the test chain's double): the
        # report must carry this appliance's binding, then the record keeps it.
        # With it, the host's certificate table (configfs-tsm's auxblob): the chain is kept
        # beside the report, under the name bind-check pairs it by.
        from attestation.certs import load_certs
        from attestation.snp_cert_table import build_cert_table
        from enclave_image.appliance import StartError, keep_evidence, prepare_keys
        from enclave_image.appliance_tsm import Collected
        from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, fake_amd, v5_report

        keys = prepare_keys(layout)
        assert not keys.created  # found on the state disk, not made again
        chain = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
        ask, ark = (c.public_bytes(Encoding.DER) for c in load_certs(chain.chain))
        table = build_cert_table([("vcek", chain.vek), ("ask", ask), ("ark", ark)])
        bound = v5_report(chain.vek_key, report_data=keys.report_data(bytes(32)), policy=0x30000)
        keep_evidence(layout, keys, Collected("sev-snp", bound, table, "configfs-tsm"), booted.say)
        stranger = v5_report(chain.vek_key, report_data=bytes(64), policy=0x30000)
        with pytest.raises(StartError, match="binding"):
            keep_evidence(
                layout, keys, Collected("sev-snp", stranger, b"", "configfs-tsm"), booted.say
            )
        # A host that hands the guest no certificate table: the chain comes from AMD's KDS
        # (here its stand-in), asked through the proxy, which records both answers.
        vcek_at = (
            "/vcek/v1/Turin/a0a1a2a3a4a5a6a7?fmcSPL=01&blSPL=02&teeSPL=03&snpSPL=04&ucodeSPL=85"
        )
        kds.documents[vcek_at] = chain.vek
        kds.documents["/vcek/v1/Turin/cert_chain"] = chain.chain
        time.sleep(1.1)  # a later boot: its evidence files get a stamp of their own
        keep_evidence(layout, keys, Collected("sev-snp", bound, b"", "sev-guest ioctl"), booted.say)
        assert kds.asked == [vcek_at, "/vcek/v1/Turin/cert_chain"]
    finally:
        booted.shut()
    assert booted.result == [0]
    lines = [line for line in said if not line.startswith("[")]
    line = next(x for x in lines if x.startswith("affidavit-appliance ready"))
    before = lines[: lines.index(line)]
    assert "health: proxy answers /metrics" in before
    assert "health: harness panel answers" in before
    assert any(x.startswith("health: engine answers /v1/models") for x in before)
    assert any(x.startswith("timer: divergence check every 7d, next 20") for x in before)
    assert "evidence: none collected: keysource=test-insecure (no TEE to ask)" in before
    check = before.index("selfcheck: FAILED: no evidence: keysource=test-insecure asks no TEE")
    assert before[check + 1] == (
        "selfcheck: WARNING: unattested operation allowed by affidavit.unattested=allow:"
        " every reply says tee_type none"
    )
    # the proxy before the self-check, the engine after it, told what it showed
    assert before.index("health: proxy answers /metrics") < check
    started = [x for x in said if x.startswith("supervisor: started ")]
    assert [x.split()[2] for x in started][:2] == ["proxy", "engine"], started
    status = json.loads((tmp_path / "run" / "tee-status.json").read_text())
    assert (status["attested"], status["tee_type"], status["allow_unattested"]) == (
        False,
        "none",
        True,
    )
    assert (
        f"model: WARNING: TEST MODEL affidavit-tiny ({tmp_path / 'model' / 'affidavit-tiny'}):"
        " a test build (test model tiny), NOT the release's model"
    ) in before
    data = bytes.fromhex(line.rsplit("report_data=", 1)[1])
    assert line.startswith(
        f"affidavit-appliance ready engine=http://127.0.0.1:{engine} "
        f"proxy=http://127.0.0.1:{proxy} harness=http://127.0.0.1:{harness} state=first-boot "
    )
    # report_data binds the keys the guest made: the log's key as the store records it.
    log_key = next(x for x in lines if x.startswith("keys: log key ")).removeprefix(
        "keys: log key "
    )
    store = SQLiteStore(tmp_path / "state" / "record" / "record.db", readonly=True)
    try:
        assert store.get_meta("log_key") == log_key
        kept = [
            entry
            for stream in store.streams()
            for entry in store.entries(stream)
            if b"evidence.archived" in entry.line
        ]
        # each bound report and its chain, once; the stranger's never
        assert len(kept) == 4
        fetched = [
            entry.line
            for stream in store.streams()
            for entry in store.entries(stream)
            if b'"fetch.' in entry.line
        ]
        assert len(fetched) == 4  # KDS's two answers, each request and response recorded
    finally:
        store.close()
    assert any(x.startswith("evidence: SNP report kept as snp-") for x in said)
    assert any(x.startswith("evidence: the host's certificates kept as snp-") for x in said)
    assert any(x.startswith("evidence: the certificates from AMD's KDS kept as snp-") for x in said)
    files = sorted((tmp_path / "state" / "evidence").iterdir())
    assert [f.suffix for f in files] == [".pem", ".report"] * 2
    assert files[0].name == files[1].name.removesuffix(".report") + ".certs.pem"
    assert files[2].name == files[3].name.removesuffix(".report") + ".certs.pem"
    assert files[2].read_bytes() == files[0].read_bytes()  # KDS's chain is the table's
    # An auditor with the self-test turn's bundle alone, and no key: both boots' reports,
    # one kept with the host's chain and one with KDS's, check out and bind this log key.
    from affidavit.cli import main as cli
    from record.bundle import export_stream

    (tmp_path / "ark.pem").write_bytes(chain.ark)
    store = SQLiteStore(tmp_path / "state" / "record" / "record.db", readonly=True)
    try:
        streams = list(store.streams())
    finally:
        store.close()
    record = tmp_path / "state" / "record" / "record.db"
    bundles = {s: export_stream(record, s, tmp_path / "bundles" / s) for s in streams}
    session = next(s for s, index in bundles.items() if index.get("boot"))
    assert len(bundles[session]["boot"]) == 2
    args = ["attest", "bind-check", str(tmp_path / "bundles" / session), "--json"]
    assert cli([*args, "--trusted-root", str(tmp_path / "ark.pem")]) == 0
    assert [c.public_bytes(Encoding.DER) for c in load_certs(files[0].read_bytes())] == [
        chain.vek,
        ask,
        ark,
    ]
    from record.seal import KeyPair

    sealing = KeyPair.read(tmp_path / "state" / "record" / "appliance.key").recipient
    assert data[:32] == binding_digest(log_key, sealing.public.public_bytes_raw())
    home = json.loads((tmp_path / "state" / "home" / "appliance.json").read_text())
    assert home["proxy_url"] == f"http://127.0.0.1:{proxy}"
    assert home["model"] == "affidavit-tiny"
    assert "keys: created at first boot in " + str(tmp_path / "state" / "record") in lines
    assert any(x.startswith("supervisor: engine stopped") for x in said)
    # The self-test turn ran through the proxy, after the ready line.
    turn = next(x for x in lines if x.startswith("selftest: "))
    assert lines.index(turn) > lines.index(line)
    assert " ANSWERED reply sha256=" in turn and turn.rsplit("steps=", 1)[1].isdigit()
