"""``docs/proxy.md`` against the code, so the document cannot drift quietly.

- Its TOML example is a valid config, and its config table names every field of the models.
- Its error table lists every data-plane error code with the status the code sends, and the
  errors module's docstring draws every error class.
- Its annotation table lists exactly the members the pipeline sends.
- It names every header of the forwarded list and of the credential deny-list.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

import egress_proxy.errors as errors
from egress_proxy.config import CollateralConfig, Listen, ProviderConfig, ProxyConfig, load_config
from egress_proxy.pipeline import Call, Committed, Upstream, annotation
from egress_proxy.providers import CREDENTIAL_HEADERS, FORWARDED_HEADERS, OPENAI
from egress_proxy.sessions import Session
from record.log import Appended

DOC = Path(__file__).resolve().parents[2] / "docs" / "proxy.md"


def doc() -> str:
    return DOC.read_text("utf-8")


def test_the_toml_example_is_a_valid_config(tmp_path: Path) -> None:
    (example,) = re.findall(r"```toml\n(.*?)```", doc(), re.DOTALL)
    path = tmp_path / "proxy.toml"
    path.write_text(example)
    config = load_config(path)
    assert set(config.mounts) == {"/v1/chat/completions", "/v1/messages"}


def test_the_config_table_names_every_field() -> None:
    keys = set(re.findall(r"^\| `([a-z_.<>]+)` \|", doc(), re.MULTILINE))
    models: list[tuple[str, type[BaseModel]]] = [
        ("", ProxyConfig),
        ("listen.", Listen),
        ("providers.<name>.", ProviderConfig),
        ("collateral.", CollateralConfig),
    ]
    for prefix, model in models:
        for name in model.model_fields:
            if name not in ("listen", "providers", "mounts"):
                assert prefix + name in keys, prefix + name
    assert {"providers.<name>", "mounts.<route>"} <= keys


def test_the_error_table_matches_the_error_tree() -> None:
    rows = dict(
        (code, status)
        for status, code in re.findall(r"^\| (\d{3}|—) \| `([a-z_]+)` \|", doc(), re.MULTILINE)
    )
    classes = [
        c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ProxyError)
    ]
    never_raised = {errors.Refused, errors.UpstreamError}  # branches of the tree only
    at_start = {errors.ConfigError, errors.ConfigMissing}  # exit codes, not HTTP statuses
    for cls in classes:
        assert cls.__name__ in (errors.__doc__ or ""), cls.__name__
        if cls in never_raised:
            continue
        if cls in at_start:
            assert f"`{cls.code}`" in doc(), cls.code
            continue
        assert cls.code in rows, cls.code
        if cls is not errors.UpstreamCut:  # sent as a cut connection, not a status
            assert rows[cls.code] == str(cls.status), cls.code


def test_the_annotation_table_lists_what_is_sent() -> None:
    section = doc().split("## 5. The annotation")[1].split("## 6.")[0]
    documented = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)? \|", section, re.MULTILINE))
    names = {n for pair in documented for n in pair if n}
    upstream = Upstream("p", OPENAI, "http://x/v1/chat/completions", None)
    call = Call(Session("s", b"", {}), upstream, {}, b"{}", {}, b"{}", request_seq=1)
    appended = Appended("s", 2, "", "model.response", "", b"", 3, b"\0" * 32)
    assert names == set(annotation(call, Committed(appended, "COMMITTED", None)))


def test_the_header_lists_are_documented() -> None:
    section = doc().split("## 6. Headers")[1].split("## 7.")[0]
    for name in FORWARDED_HEADERS | CREDENTIAL_HEADERS:
        assert f"`{name}`" in section, name
