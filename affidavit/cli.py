"""``affidavit``: the command line, a typer app assembled from each part's commands.

This thin module sits above the parts: it alone takes the record's, the engine's, the
harness's, attestation's, the panel's and the image's commands onto one app, so no part
imports another only to reach its commands (``harness`` imports neither ``inference`` nor
``enclave_image``; ``tests/test_import_graph.py`` holds it to that).

Exit codes everywhere: 0 fine, 1 a problem was found, 2 usage error (a key file that is not
a key, a home another ``up`` holds), 3 something it needs is missing (a running appliance, a
session, a turn, a store, bundle, key file or an extra).

:func:`main` runs the app without click's standalone mode and *returns* the exit code: a
usage error (unknown option, missing argument, bad value) is printed on stderr and gives 2,
and an expected condition that escapes a command (``harness.state.HomeError``, an error of
the record, a control socket nobody answers) gives its documented code in one line, never a
traceback. Each part's ``cli`` module imports nothing heavy until its command runs (no
torch for ``log verify``).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Annotated, Any, Protocol, cast

import typer

import egress_proxy.control_store  # noqa: F401  (registers control: stores: --store control:/…)
from attestation import cli as attestation_cli
from attestation import connect_cli
from enclave_image import cli as image_cli
from harness import attest_collect, commands, tools_cli
from harness.panel import cli as panel_cli
from harness.state import HomeError
from inference import cli as engine_cli
from record import cli as record_cli

__all__ = ["app", "build_app", "click_command", "main"]

EXIT_OK, EXIT_PROBLEM, EXIT_MISSING = (
    record_cli.EXIT_OK,
    record_cli.EXIT_PROBLEM,
    record_cli.EXIT_MISSING,
)


class _ClickError(Protocol):
    """What ``main`` uses of click's ``ClickException``."""

    exit_code: int

    def show(self, file: IO[Any] | None = None) -> None: ...


def _click_exception() -> type[Exception]:
    """click's ``ClickException`` as this typer raises it (typer ships its own copy of click
    in recent versions and used click itself before), found from typer's public
    ``BadParameter``."""
    for cls in typer.BadParameter.__mro__:
        if cls.__name__ == "ClickException":
            return cast(type[Exception], cls)
    raise ImportError(
        "typer.BadParameter does not derive from a ClickException"
    )  # pragma: no cover


_CLICK_EXCEPTION = _click_exception()

_HOME_HELP = (
    "taken by every command so that a script can pass its home to each; this one reads no "
    "state folder, so it changes nothing here"
)


def _home_everywhere(tree: Any) -> Any:
    """Give every command without ``--home`` one that it accepts and ignores.

    ``--home`` is the one option every command takes (``docs/cli.md``): the commands that read
    no state folder (``engine …``, ``image …``, ``attest verify``) accept it too, saying in
    their help that it changes nothing there, so a script never has to know which is which.
    The option is a copy of a harness command's own ``--home`` (typer builds its options with
    private types), kept from reaching the command's function.
    """
    leaves = list(_leaves(tree))
    model = next(p for c in leaves for p in c.params if getattr(p, "opts", None) == ["--home"])
    for command in leaves:
        if not any("--home" in getattr(p, "opts", ()) for p in command.params):
            home = copy.copy(model)
            home.expose_value = False
            home.help = _HOME_HELP
            command.params.append(home)
    return tree


def _leaves(command: Any) -> Iterator[Any]:
    """Every command under ``command`` that runs something (groups have ``commands``)."""
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        yield command
        return
    for sub in subcommands.values():
        yield from _leaves(sub)


def demo(
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--home",
            "--workdir",
            metavar="<path>",
            help="the demo's state folder, new or empty: its store and keys (default: a new "
            "temporary folder)",
            show_default=False,
        ),
    ] = None,
    report: Annotated[
        Path | None,
        typer.Option(help="where to write the report (default .affidavit/demo-report.json)"),
    ] = None,
) -> None:
    """A pinned tool-using turn through the proxy, recorded, reconstructed, re-executed."""
    from harness.demo import run_demo

    code = run_demo(workdir, report)
    if code != EXIT_OK:
        raise typer.Exit(code)


def build_app() -> typer.Typer:
    """The ``affidavit`` app: ``demo``, each part's commands, then the harness's own."""
    root = typer.Typer(
        name="affidavit",
        help="A recorded, sealed, replayable agent harness.",
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
    )
    # A callback keeps the app a group of commands whatever is registered on it.
    root.callback()(_root)
    root.command("demo")(demo)
    record_cli.register(root)
    engine_cli.register(root)
    commands.register(root)
    attest_collect.register(attestation_cli.register(root))
    connect_cli.register(root)
    panel_cli.register(root)
    image_cli.register(root)
    tools_cli.register(root)
    return root


def _print_version(asked: bool) -> None:
    """``--version``: the installed distribution's version, then exit 0."""
    if asked:
        from importlib.metadata import version

        print(f"affidavit {version('affidavit')}")
        raise typer.Exit(EXIT_OK)


def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="print the version and exit",
            is_eager=True,
            callback=_print_version,
        ),
    ] = False,
) -> None:
    """A recorded, sealed, replayable agent harness."""


app = build_app()


def click_command() -> Any:
    """The click command ``main`` runs: ``app`` with ``--home`` on every command."""
    return _home_everywhere(typer.main.get_command(app))


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``affidavit`` with ``argv`` (default: ``sys.argv[1:]``) and return its exit code."""
    command = click_command()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = command.main(args=args, prog_name="affidavit", standalone_mode=False)
    except _CLICK_EXCEPTION as exc:  # usage errors (2) and click's other errors
        error = cast(_ClickError, exc)
        error.show()
        return error.exit_code
    except typer.Abort:
        print("Aborted!", file=sys.stderr)
        return EXIT_PROBLEM
    except HomeError as exc:  # 3: no appliance, session, turn, store or key; 2: a bad key file
        print(f"affidavit: {exc.prefix}: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        code = record_cli.report_error(exc)
        if code is None:
            code = _appliance_gone(exc)
        if code is None:
            raise
        return code
    # A command returns None (0) or raises typer.Exit(code), which click returns as an int.
    return result if isinstance(result, int) else EXIT_OK


def _appliance_gone(exc: Exception) -> int | None:
    """gRPC's UNAVAILABLE from a control socket nobody answers (its ``up`` was killed) is
    an appliance that is missing (3), said in one line; ``None`` for any other error."""
    if type(exc).__module__.split(".")[0] != "grpc":
        return None
    import grpc

    if not isinstance(exc, grpc.RpcError) or exc.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    print(
        "affidavit: missing: the appliance's control socket does not answer (its `affidavit up`"
        " has stopped): run `affidavit up`",
        file=sys.stderr,
    )
    return EXIT_MISSING


if __name__ == "__main__":
    sys.exit(main())
