"""Fuzz targets for every parser that reads bytes from outside: one module per parser.

Each target module exposes ``target(data: bytes) -> None`` (it calls the parser and swallows
only that parser's own typed errors, so anything else that comes out is a finding) and
``seeds() -> list[bytes]`` (small valid inputs built in code, plus the public vectors when
``../shared/vectors`` is present). ``python -m fuzz.run`` drives them: coverage-guided with
atheris where it is installed, otherwise with hypothesis.
"""
