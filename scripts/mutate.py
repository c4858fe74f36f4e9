"""`make mutate`: mutation testing of the security checks, one module at a time (mutmut 3).

Why: a check that no test fails without is a check nobody knows works. mutmut breaks one
line of a module at a time (a mutant) and runs that module's own tests against it; a mutant
that no test kills is a break the tests would not notice.

Each target is run in its own scratch copy of the project under ``mutants/<target>/``
(ignored by git; mutmut writes its mutated copy in ``mutants/<target>/mutants/``), with a
generated ``[tool.mutmut]`` naming only that target's files and its tests, so nothing is
written into the tracked tree and a target's run needs only its own fast tests. The public
vectors (``../shared``) are linked in beside the copy, where the tests look for them.

    python scripts/mutate.py                      # every target
    python scripts/mutate.py attestation/snp.py   # one or more targets by name
    python scripts/mutate.py --list               # the targets and their tests
    python scripts/mutate.py --survivors ...      # also print each survivor's diff

Each survivor (and each mutant mutmut stopped) is then run again in a fresh Python process
with the mutant active from import on (``--no-recheck`` skips this): mutmut forks every mutant
from one import, so a mutant of code that runs at import is never active in its own run.

Prints killed / survived / other / total per target, and exits 1 when a target kills fewer
than ``--min-killed`` percent (90 by default) of its mutants, 3 when mutmut is missing.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / "mutants"
#: the project's packages, copied whole into each scratch copy (the tests import across them)
PACKAGES = (
    "affidavit",
    "record",
    "egress_proxy",
    "harness",
    "inference",
    "attestation",
    "enclave_image",
    "measurements",
    "fuzz",
)
#: copied as they are, beside the packages: tests that hold the code to what the documents say
#: (``test_format_exact.py`` reads ``docs/record.md``) read them there
ALSO_COPIED = ("docs",)
#: downloads the tests pin by hash and keep (``test_nvidia_rim.py``'s wheel of NVIDIA's RIMs)
TEST_CACHE = ".affidavit/test-cache"
#: mutmut's exit codes, as ``mutmut.stats.status_by_exit_code`` reads them
KILLED = {1, 3, 37}
SURVIVED = {0}


@dataclass(frozen=True)
class Target:
    """Source files mutated together, and the tests that must kill their mutants."""

    files: tuple[str, ...]
    tests: tuple[str, ...]
    #: mutmut mutant-name globs (``module.x_function__mutmut_*``); empty: every function
    functions: tuple[str, ...] = ()
    pytest_args: tuple[str, ...] = field(default=())
    #: mutmut's ``timeout_multiplier``: 4 stops a loop that never ends in seconds; a target
    #: whose tests spend their time in fixtures (which mutmut does not count) needs more
    timeout_multiplier: float = 4.0


T = "tests/"
TARGETS: dict[str, Target] = {
    "record/merkle.py": Target(
        ("record/merkle.py",), (T + "record/test_merkle.py", T + "record/test_signed_tail.py")
    ),
    "record/checkpoint.py": Target(
        ("record/checkpoint.py",),
        (T + "record/test_checkpoint.py", T + "record/test_signed_tail.py"),
    ),
    # audit and reader: rows in memory, word for word (test_audit_problems.py, about a second);
    # the store and bundle tamper tests (test_audit.py, test_tamper.py) take a minute a mutant;
    # the format document's cases (test_format_exact.py, a few seconds) judge bundles end to end
    "record/audit.py": Target(
        ("record/audit.py",),
        (
            T + "record/test_audit_problems.py",
            T + "record/test_audit_mutants.py",
            T + "record/test_format_exact.py",
            T + "record/test_signed_tail.py",
        ),
    ),
    "record/digest.py": Target(  # that test reads the source, where mutmut writes None
        ("record/digest.py",),
        (T + "record/test_digest.py", T + "record/test_canonical.py"),
        pytest_args=("-k", "not passes_a_literal_domain"),
    ),
    "record/seal.py": Target(("record/seal.py",), (T + "record/test_seal.py",)),
    "record/reader.py": Target(
        ("record/reader.py",),
        (T + "record/test_audit_problems.py", T + "record/test_seal.py"),
    ),
    # the entry and body models in process and the format document's cases (seconds); not
    # test_bad_input.py, whose CLI runs on written stores take minutes a mutant
    "record/schema.py": Target(
        ("record/schema.py",),
        (
            T + "record/test_schema_mutants.py",
            T + "record/test_schema.py",
            T + "record/test_format_exact.py",
            T + "record/test_format_doc.py",
            T + "record/test_audit_problems.py",
        ),
    ),
    # each limit at its edge in process (under a second); not tests/egress_proxy/test_limits.py,
    # whose proxy and store runs take twenty seconds a mutant
    "record/limits.py": Target(("record/limits.py",), (T + "record/test_limits_mutants.py",)),
    "record/store.py": Target(  # only the evidence name rule: the rest is the abstract contract
        ("record/store.py",),
        (T + "record/test_store_mutants.py", T + "record/test_store_contract.py"),
    ),
    "record/show.py": Target(  # in process; test_cli.py runs `log show` as a subprocess
        ("record/show.py",), (T + "record/test_show_mutants.py",)
    ),
    # the rules and views on bodies built in process (a second); not test_redact.py, whose
    # session recorded through the proxy and `log show` subprocesses take seconds a mutant
    "record/redact.py": Target(("record/redact.py",), (T + "record/test_redact_mutants.py",)),
    # the contract on a real file (seconds); not test_crash_safety.py, whose killed writer
    # processes take half a minute a mutant
    "record/sqlite_store.py": Target(
        ("record/sqlite_store.py",),
        (
            T + "record/test_sqlite_store_mutants.py",
            T + "record/test_store_contract.py",
            T + "record/test_evidence_archive.py",
            T + "record/test_readonly.py",
        ),
    ),
    # where a store is (a path or a postgresql:// URL) and opening it; then the writer's and
    # the contract's uses of it (a private PostgreSQL cluster, started once, about a second)
    "record/backends.py": Target(
        ("record/backends.py",),
        (
            T + "record/test_backends_mutants.py",
            T + "record/test_log_mutants.py",
        ),
    ),
    # the PostgreSQL store: the contract run against the private cluster (each test on a
    # fresh database), then the writer on it
    "record/postgres_store.py": Target(
        ("record/postgres_store.py",),
        (
            T + "record/test_store_contract.py",
            T + "record/test_backends_mutants.py",
        ),
        pytest_args=("-k", "postgres"),
        timeout_multiplier=8.0,
    ),
    # the decoder on bytes written out, with test_redact.py's own decoder tests and the views
    # (which read every form): a second; not test_redact.py's recorded session
    "record/decoded.py": Target(
        ("record/decoded.py",),
        (
            T + "record/test_decoded_mutants.py",
            T + "record/test_redact.py::test_a_messages_stream_is_reassembled_into_its_message",
            T
            + "record/test_redact.py::test_a_responses_stream_is_reassembled_and_unknown_events_are_kept",
            T + "record/test_redact.py::test_other_bodies_decode_by_what_they_are",
            T + "record/test_redact_mutants.py",
        ),
    ),
    # export byte for byte and each spoiled bundle word for word first (seconds), then the
    # format document's cases and the signed-tail bundles; not test_tamper.py or
    # test_audit.py (a minute a mutant)
    "record/bundle.py": Target(
        ("record/bundle.py",),
        (
            T + "record/test_bundle_mutants.py",
            T + "record/test_format_doc.py",
            T + "record/test_format_exact.py",
            T + "record/test_signed_tail.py",
        ),
    ),
    # the writer in process on real files, word for word first (a second or two), then the
    # evidence archive, sealing and the signed tail's in-process tests; not test_signed_tail.py's
    # `log verify` subprocess runs, nor test_crash_safety.py's killed writers
    "record/log.py": Target(
        ("record/log.py",),
        (
            T + "record/test_log_mutants.py",
            T + "record/test_evidence_archive.py",
            T + "record/test_seal.py",
            T
            + "record/test_signed_tail.py::test_every_append_is_covered_and_a_batch_costs_one_signature",
            T
            + "record/test_signed_tail.py::test_a_skipped_key_epoch_is_malformed_for_the_audit_and_the_reader",
            T + "record/test_signed_tail.py::test_consecutive_key_epochs_are_fine",
        ),
    ),
    # not record/errors.py: class constants and one f-string that mutmut 3 leaves alone, so it
    # makes no mutant there (and stops, failing the run); test_errors_mutants.py pins each code
    # `keys` and `log` in process on stores written with Log (seconds); not test_cli.py's
    # subprocess runs, which take seconds a command
    "record/cli.py": Target(
        ("record/cli.py",),
        (
            T + "record/test_cli_mutants.py",
            T + "record/test_cli.py::test_a_mapped_error_is_an_exit_code_in_process",
            T + "record/test_cli.py::test_an_error_not_mapped_is_not_swallowed",
            T + "record/test_cli.py::test_json_of_keys_new_and_the_log_commands_that_print_facts",
        ),
    ),
    "egress_proxy/admission.py": Target(  # the pure rule first: a break fails in a second
        ("egress_proxy/admission.py",),
        (
            T + "egress_proxy/test_admission_rule.py",
            T + "egress_proxy/test_tool_admission.py",
            T + "egress_proxy/test_fetch_admission.py",
        ),
    ),
    "egress_proxy/replay.py": Target(
        ("egress_proxy/replay.py",),
        (
            T + "egress_proxy/test_reconstruction_unit.py",
            T + "egress_proxy/test_replay.py",
            T + "record/test_readonly.py",
        ),
    ),
    "egress_proxy/replay_plan.py": Target(  # the plan as a unit first, then end to end
        ("egress_proxy/replay_plan.py",),
        (
            T + "egress_proxy/test_replay_plan_unit.py",
            T + "egress_proxy/test_reexecute.py",
            T + "egress_proxy/test_session_restore.py",
        ),
    ),
    "attestation/snp.py": Target(  # with the CRL through the verifier (chain.revocation)
        ("attestation/snp.py",), (T + "attestation/test_snp.py", T + "attestation/test_amd_crl.py")
    ),
    "attestation/tdx": Target(
        (
            "attestation/tdx.py",
            "attestation/tdx_quote.py",
            "attestation/tdx_tcb.py",
            "attestation/tdx_certs.py",
            "attestation/tdx_collateral.py",
        ),
        # the collateral and TCB checks on a test double of Intel's PKI first (about a second),
        # then the quote parser and chain helpers as a unit (under a second)
        (
            T + "attestation/test_tdx_collateral.py",
            T + "attestation/test_tdx_quote_unit.py",
            T + "attestation/test_tdx.py",
        ),
    ),
    "attestation/nvidia.py": Target(  # with the RIM checks it hands NVIDIA's RIMs to
        ("attestation/nvidia.py", "attestation/nvidia_chain.py"),
        (T + "attestation/test_nvidia.py", T + "attestation/test_nvidia_rim.py"),
    ),
    # the attestation policy: its rules on facts written out first (about a second), then on
    # real SNP evidence, then the verdict and the CLI that state it
    "attestation/policy.py": Target(
        ("attestation/policy.py",),
        (
            T + "attestation/test_policy_unit.py",
            T + "attestation/test_snp_policy.py",
            T + "attestation/test_verdict.py",
            T + "attestation/test_verdict_output.py",
            T + "attestation/test_attest_cli.py",
        ),
    ),
    "attestation/amd_crl.py": Target(  # the check as a unit first, then through the verifier
        ("attestation/amd_crl.py",),
        (T + "attestation/test_amd_crl_unit.py", T + "attestation/test_amd_crl.py"),
    ),
    "attestation/snp_cert_table.py": Target(
        ("attestation/snp_cert_table.py",), (T + "attestation/test_snp_cert_table.py",)
    ),
    # RIMs signed by a test chain first (what NVIDIA's samples never show; under a second),
    # then NVIDIA's real RIMs, from the wheel cached in .affidavit/test-cache (copied in beside)
    "attestation/nvidia_rim.py": Target(
        ("attestation/nvidia_rim.py",),
        (T + "attestation/test_nvidia_rim_unit.py", T + "attestation/test_nvidia_rim.py"),
    ),
    "attestation/verdict.py": Target(
        ("attestation/verdict.py",),
        (
            T + "attestation/test_verdict.py",
            T + "attestation/test_verdict_output.py",
            T + "attestation/test_snp.py",
        ),
    ),
    "attestation/bind_check.py": Target(  # its helpers word for word first (a second or two)
        ("attestation/bind_check.py",),
        (
            T + "attestation/test_bind_check_unit.py",
            T + "attestation/test_bind_check.py",
            T + "attestation/test_bind_check_boot.py",
            T + "attestation/test_bind_check_boot_mutants.py",
            T + "attestation/test_binding.py",
            T + "attestation/test_bind_check_cli.py",
        ),
    ),
    "attestation/binding.py": Target(
        ("attestation/binding.py",),
        (T + "attestation/test_binding.py", T + "attestation/test_bind_check.py"),
    ),
    # not attestation/amd_roots.py: constants only, and mutmut mutates only what is in a
    # function, so it makes no mutant there (and stops, failing the run); test_snp.py's
    # test_pinned_roots_are_the_vector_arks holds each pin to the public chains instead
    "attestation/amd_kds.py": Target(
        ("attestation/amd_kds.py",),
        (T + "attestation/test_amd_kds_mutants.py", T + "attestation/test_amd_kds.py"),
    ),
    "attestation/pck.py": Target(  # the PCK's SGX extension, read in the TDX checks
        ("attestation/pck.py",),
        (
            T + "attestation/test_pck_mutants.py",
            T + "attestation/test_tdx_collateral.py",
            T + "attestation/test_tdx.py",
        ),
    ),
    "attestation/snp_report.py": Target(  # the parser field by field first (a second)
        ("attestation/snp_report.py",),
        (
            T + "attestation/test_snp_report_mutants.py",
            T + "attestation/test_snp.py",
            T + "attestation/test_amd_kds.py",
        ),
    ),
    "attestation/published.py": Target(
        ("attestation/published.py",),
        (
            T + "attestation/test_published_mutants.py",
            T + "attestation/test_binding.py",
            T + "attestation/test_attest_cli.py",
        ),
    ),
    "attestation/evidence.py": Target(  # read and verified by both commands
        ("attestation/evidence.py",),
        (
            T + "attestation/test_evidence_mutants.py",
            T + "attestation/test_attest_cli.py",
            T + "attestation/test_bind_check_cli.py",
        ),
    ),
    "attestation/measure.py": Target(
        ("attestation/measure.py",),
        (
            T + "attestation/test_measure_mutants.py",
            T + "attestation/test_measure.py",
            T + "attestation/test_binding.py",
        ),
    ),
    "attestation/certs.py": Target(
        ("attestation/certs.py",),
        (
            T + "attestation/test_certs.py",
            T + "attestation/test_snp.py",
            T + "attestation/test_tdx.py",
        ),
    ),
    # `attest verify` and `attest policy` in process, word for word first (seconds); then the
    # end-to-end CLI tests on NVIDIA's vector and the SNP test double, and --crl/--fetch-crl
    "attestation/cli.py": Target(
        ("attestation/cli.py",),
        (
            T + "attestation/test_attest_cli_mutants.py",
            T + "attestation/test_attest_cli.py",
            T + "attestation/test_snp_policy.py",
            T + "attestation/test_amd_crl.py",
        ),
    ),
    # the panel's proof code: where an entry sits and its inclusion check, not the page source
    "harness/panel/source.py": Target(
        ("harness/panel/source.py",),
        (T + "harness/test_panel.py",),
        functions=(
            "harness.panel.source.x_check_inclusion__mutmut_*",
            "harness.panel.source.xǁStreamRecordǁposition__mutmut_*",
        ),
        pytest_args=("-k", "proof or inclusion"),
        timeout_multiplier=15.0,  # the recorded appliance is built in a fixture
    ),
}


def _toml_list(items: list[str] | tuple[str, ...]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _prepare(name: str, target: Target) -> Path:
    """A scratch copy of the project for one target, with its ``[tool.mutmut]``."""
    work = SCRATCH / name.replace("/", "_").removesuffix(".py")
    work.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for part in (*PACKAGES, "tests", *ALSO_COPIED):
        shutil.rmtree(work / part, ignore_errors=True)
        shutil.copytree(ROOT / part, work / part, ignore=ignore, symlinks=True)
    # a new copy of the code: mutmut's own copy of the old one must not be reused
    shutil.rmtree(work / "mutants", ignore_errors=True)
    shared = ROOT.parent / "shared"
    link = work / "shared"
    if shared.is_dir() and not link.exists():
        link.symlink_to(shared)
    # what the tests downloaded once (hash-pinned), copied into mutmut's copy by also_copy
    cache = ROOT / TEST_CACHE
    if cache.is_dir():
        shutil.rmtree(work / TEST_CACHE, ignore_errors=True)
        shutil.copytree(cache, work / TEST_CACHE)
    config = "\n".join(
        [
            "",
            "[tool.mutmut]",
            f"source_paths = {_toml_list(list(PACKAGES))}",
            f"only_mutate = {_toml_list(target.files)}",
            f"pytest_add_cli_args_test_selection = {_toml_list([*target.tests, *target.pytest_args])}",
            'pytest_add_cli_args = ["-p", "no:cacheprovider"]',
            f"also_copy = {_toml_list([TEST_CACHE, *ALSO_COPIED])}",
            "use_git_change_detection = false",
            # a mutant that loops forever (a Merkle split that never shrinks) is stopped after
            # (test CPU time + 1) * 2 * this many CPU seconds; mutmut's 15 spends minutes each
            f"timeout_multiplier = {target.timeout_multiplier}",
            "",
        ]
    )
    (work / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + config)
    return work


@dataclass
class Count:
    killed: int = 0
    survived: int = 0
    other: int = 0
    survivors: list[str] = field(default_factory=list)
    #: killed only when run again in a fresh process (``_recheck``)
    rechecked: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.killed + self.survived + self.other

    @property
    def score(self) -> float:
        return 100.0 * self.killed / self.total if self.total else 100.0


def _count(work: Path, target: Target) -> Count:
    """Killed / survived / other from mutmut's ``.meta`` files (one per mutated file)."""
    count = Count()
    for path in target.files:
        meta = json.loads((work / "mutants" / (path + ".meta")).read_text())
        for key, code in meta["exit_code_by_key"].items():
            if target.functions and not any(fnmatch.fnmatch(key, g) for g in target.functions):
                continue
            if code in KILLED:
                count.killed += 1
            elif code in SURVIVED:
                count.survived += 1
                count.survivors.append(key)
            else:
                count.other += 1
                count.survivors.append(f"{key} (exit {code})")
    return count


#: a name no mutant has: the trampolines then run the original code
NO_MUTANT = "affidavit.no_mutant"


def _pytest_fails(work: Path, target: Target, mutant: str, limit: float) -> bool | None:
    """Whether the target's tests fail with ``mutant`` active from import on (None: ran past
    ``limit`` seconds)."""
    env = {**os.environ, "MUTANT_UNDER_TEST": mutant, "PYTHONDONTWRITEBYTECODE": "1"}
    run = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    try:
        done = subprocess.run(
            [*run, *target.tests, *target.pytest_args],
            cwd=work / "mutants",
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=limit,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    return done.returncode != 0


def _recheck(work: Path, target: Target, count: Count) -> Count:
    """Each survivor and each other mutant run again in a fresh Python process.

    mutmut imports the code once and forks every mutant from it, so a mutant of code that
    runs at import (a validator a model builds in its class body, a pattern compiled into a
    module constant) is never active in its run. Here the mutant is active from the start;
    one that fails the target's tests now is counted killed. Nothing is rechecked when the
    tests fail with no mutant at all; a mutant is stopped after ten times their time (a loop
    that never ends stays "other").
    """
    started = time.monotonic()
    if _pytest_fails(work, target, NO_MUTANT, 3600.0) is not False:
        print(f"recheck skipped: {' '.join(target.tests)} do not pass without a mutant")
        return count
    limit = max(60.0, 10 * (time.monotonic() - started))
    kept = Count(killed=count.killed)
    for entry in count.survivors:
        key = entry.split(" ")[0]
        if _pytest_fails(work, target, key, limit):
            kept.killed += 1
            kept.rechecked.append(key)
        elif entry == key:
            kept.survived += 1
            kept.survivors.append(entry)
        else:
            kept.other += 1
            kept.survivors.append(entry)
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="target names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the targets and stop")
    parser.add_argument("--survivors", action="store_true", help="show each survivor's diff")
    parser.add_argument("--min-killed", type=float, default=90.0, metavar="PERCENT")
    parser.add_argument("--max-children", type=int, default=2, help="parallel mutants")
    parser.add_argument(
        "--no-recheck",
        action="store_true",
        help="do not run each survivor again in a fresh process (see _recheck)",
    )
    args = parser.parse_args(argv)
    if args.list:
        for name, target in TARGETS.items():
            print(f"{name}: {' '.join(target.files)} <- {' '.join(target.tests)}")
        return 0
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        print(f"unknown target(s): {', '.join(unknown)}; see --list", file=sys.stderr)
        return 2
    mutmut = Path(sys.executable).with_name("mutmut")
    if not mutmut.exists():
        print(f"{mutmut} is missing: install the dev extra (pip install -e '.[dev]')")
        return 3
    results: dict[str, Count] = {}
    for name in args.targets or list(TARGETS):
        target = TARGETS[name]
        work = _prepare(name, target)
        print(f"== {name}: mutmut in {work.relative_to(ROOT)}", flush=True)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        run = [str(mutmut), "run", "--max-children", str(args.max_children), *target.functions]
        log = work / "mutmut.log"
        with log.open("w") as out:
            done = subprocess.run(run, cwd=work, env=env, stdout=out, stderr=out, check=False)
        if done.returncode != 0:
            print(f"{name}: mutmut exited {done.returncode}; see {log}", file=sys.stderr)
            results[name] = Count(other=1, survivors=["(mutmut failed)"])
            continue
        results[name] = count = _count(work, target)
        if not args.no_recheck and count.survivors:
            results[name] = count = _recheck(work, target, count)
        if args.survivors:
            for key in count.survivors:
                subprocess.run([str(mutmut), "show", key.split(" ")[0]], cwd=work, check=False)
    print(f"\n{'target':32} {'killed':>7} {'survived':>9} {'other':>6} {'total':>6} {'score':>7}")
    for name, c in results.items():
        print(f"{name:32} {c.killed:7} {c.survived:9} {c.other:6} {c.total:6} {c.score:6.1f}%")
        if c.rechecked:
            print(f"    killed when run again in a fresh process: {len(c.rechecked)}")
        for key in c.survivors:
            print(f"    survivor: {key}")
    low = [n for n, c in results.items() if c.score < args.min_killed]
    if low:
        print(f"below {args.min_killed:g}% killed: {', '.join(low)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
