"""A stand-in parser with a planted bug (a double of a parser, for the runner's own test):
the fuzzer must find it, keep its input and exit 1."""

from __future__ import annotations

ERRORS: tuple[type[BaseException], ...] = (ValueError,)


class PlantedBug(Exception):
    """Not this parser's typed error: a crash."""


def seeds() -> list[bytes]:
    return [b"fine", b"also fine"]


def target(data: bytes) -> None:
    try:
        if data[:1] == b"!":
            raise PlantedBug("an input starting with '!'")
        if data[:1] == b"?":
            raise ValueError("a typed error: expected, not a crash")
    except ValueError:
        pass
