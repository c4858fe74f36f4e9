"""``bind-check`` over several boot bundles: one that does not parse, one whose folder is not
its stream's name, beside the real one (what ``make mutate`` showed no test held).

The same real appliance as ``test_bind_check_boot.py`` (its module fixture: the real proxy,
control plane, record and bundle; the boot report signed by the test double of AMD's chain).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from record.bundle import BOOT, ENTRIES, INDEX
from tests.attestation.test_bind_check_boot import REPORT, Appliance, _bind_check, _export
from tests.attestation.test_bind_check_boot import appliance as appliance  # the fixture


def test_each_boot_bundle_is_judged_on_its_own_and_one_that_does_not_parse_stops_none(
    appliance: Appliance, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _export(appliance, tmp_path)
    real = bundle / BOOT / appliance.boot
    shutil.copytree(real, bundle / BOOT / "a-broken")
    (bundle / BOOT / "a-broken" / ENTRIES).write_bytes(b"not an entry\n")
    shutil.copytree(real, bundle / BOOT / "b-copy")  # its stream is still appliance.boot
    index = json.loads((bundle / INDEX).read_text())
    index["boot"] = ["a-broken", "b-copy", appliance.boot]
    (bundle / INDEX).write_text(json.dumps(index))
    code, checks = _bind_check(appliance, bundle, capsys)
    assert code == 1  # the bundle check refuses the two folders
    assert f"evidence.{BOOT}/a-broken/{REPORT}" not in checks
    # no stream of that name was audited, so none of its entries is a signed one
    copy = checks[f"evidence.{BOOT}/b-copy/{REPORT}"]
    assert (copy["ok"], copy["detail"]) == (
        False,
        "not judged: no evidence.archived entry of stream b-copy is covered by a signed "
        "checkpoint, so no collection time is the log's word",
    )
    # the real one after them is still judged, at its stream's first signed archive
    own = checks[f"evidence.{BOOT}/{appliance.boot}/{REPORT}"]
    assert own["ok"] is True
    assert str(own["detail"]).endswith(
        f"the time of stream {appliance.boot}'s first signed evidence.archived entry (seq 1): "
        "no key links the file to its own entry"
    )
