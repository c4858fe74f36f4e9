"""A character-level acceptor for JSON values: a pushdown automaton with hashable states.

Constrained decoding asks one question many times: "does this text keep the output a valid
prefix?". This module answers it one character at a time. A grammar is a graph of nodes
(:class:`Str`, :class:`Num`, :class:`Obj`, …, built from a JSON schema by
:func:`inference.tool_calls.compile_schema`); a state is an immutable tuple of frames,
one per open construct (the stack, top last). So a state is hashable (the token masks of
:mod:`inference.constrained` are memoised per state) and copying one is free; :func:`step`
returns a new state or ``None``.

The language is deliberately narrow, so that the automaton stays deterministic and a value
has one spelling:

- no whitespace except the fixed separators (default ``", "`` and ``": "``: how
  ``json.dumps`` and the chat template's ``tojson`` write JSON);
- an object's keys come in the order the grammar lists them (:class:`Obj`);
- keys and enum values are fixed texts; free strings take any character but ``"``, ``\\``
  and control characters, plus the JSON escapes (``\\uXXXX`` but not surrogates, so the
  text always decodes to valid Unicode);
- numbers follow the JSON grammar, within :data:`MAX_INT_DIGITS` and its siblings; an
  integer has no fraction or exponent. A number or an enum value that is a prefix of
  another ends when the next character cannot continue it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeAlias

__all__ = [
    "DEFAULT_SEPARATORS",
    "MAX_EXP_DIGITS",
    "MAX_FRACTION_DIGITS",
    "MAX_INT_DIGITS",
    "Arr",
    "Enum",
    "Lit",
    "LitFrame",
    "MapObj",
    "Node",
    "Num",
    "Obj",
    "Seq",
    "State",
    "Str",
    "StrFrame",
    "Switch",
    "Syntax",
    "Union",
    "can_finish",
    "first_chars",
    "step",
]

DEFAULT_SEPARATORS = (", ", ": ")
#: Number limits that keep every value inside I-JSON (RFC 7493), so RFC 8785 can canonicalise
#: it: at most 15 integer digits (an integer is then exact in a double), an exponent of at
#: most 2 digits (so a value stays finite), and at most 15 fraction digits.
MAX_INT_DIGITS = 15
MAX_FRACTION_DIGITS = 15
MAX_EXP_DIGITS = 2
_DIGITS = "0123456789"
_HEX = frozenset("0123456789abcdefABCDEF")


class Syntax:
    """The separators, and the any-value node built once per separator pair."""

    def __init__(self, separators: tuple[str, str] = DEFAULT_SEPARATORS) -> None:
        item, key = separators
        if item.rstrip(" ") != "," or key.rstrip(" ") != ":":
            raise ValueError(f"separators must be ',' and ':' with trailing spaces: {separators}")
        self.item = Lit(item)
        self.key = Lit(key)
        self.any = Union({})
        self.any.dispatch.update(dict.fromkeys(_DIGITS + "-", Num(integer=False)))
        self.any.dispatch.update(
            {
                '"': Str(0, None),
                "{": MapObj(self.any, self),
                "[": Arr(self.any, 0, None, self),
                "t": Enum(("true",)),
                "f": Enum(("false",)),
                "n": Enum(("null",)),
            }
        )

    def rest(self, sep: Lit) -> tuple[Frame, ...]:
        """Frames for a separator after its first character (none for a bare one)."""
        return (LitFrame(sep, 1),) if len(sep.text) > 1 else ()


# --- nodes: the compiled grammar (identity-hashed, shared by every state) -----------------


@dataclass(eq=False, slots=True)
class Lit:
    """Exact text. ``atomic`` marks a tag that the token layer emits as one special token."""

    text: str
    atomic: bool = False

    def start(self) -> tuple[Frame, ...]:
        return (LitFrame(self, 0),)


@dataclass(eq=False, slots=True)
class Seq:
    """Parts one after the other."""

    parts: tuple[Node, ...]

    def start(self) -> tuple[Frame, ...]:
        frames: tuple[Frame, ...] = ()
        for part in reversed(self.parts):  # bottom of the stack first: the last part
            frames += part.start()
        return frames


@dataclass(eq=False, slots=True)
class Switch:
    """One of several prefix-free literals (``texts``), each followed by its ``nexts``."""

    texts: tuple[str, ...]
    nexts: tuple[Node, ...]

    def __post_init__(self) -> None:
        for a in self.texts:
            if not a or any(a != b and b.startswith(a) for b in self.texts):
                raise ValueError(f"switch literals must be non-empty and prefix-free: {a!r}")

    def start(self) -> tuple[Frame, ...]:
        return (SwitchFrame(self, 0, tuple(range(len(self.texts)))),)


@dataclass(eq=False, slots=True)
class Str:
    """A JSON string of ``min_len..max_len`` characters (``None``: unbounded)."""

    min_len: int
    max_len: int | None

    def start(self) -> tuple[Frame, ...]:
        return (StrFrame(self, 0, -1),)


@dataclass(eq=False, slots=True)
class Num:
    """A JSON number, or an integer (no fraction, no exponent)."""

    integer: bool

    def start(self) -> tuple[Frame, ...]:
        return (NumFrame(self, _N_START, 0),)


@dataclass(eq=False, slots=True)
class Enum:
    """One of a fixed set of JSON texts (enum, const, true/false/null); may share prefixes."""

    options: tuple[str, ...]

    def start(self) -> tuple[Frame, ...]:
        return (EnumFrame(self, 0, tuple(range(len(self.options)))),)


@dataclass(eq=False, slots=True)
class Arr:
    """An array of ``items``, ``min_items..max_items`` long."""

    items: Node
    min_items: int
    max_items: int | None
    syntax: Syntax

    def start(self) -> tuple[Frame, ...]:
        return (ArrFrame(self, _OPEN, 0),)


class Obj:
    """An object with declared properties in order; required ones must all appear."""

    __slots__ = ("closable_from", "keys", "next_keys", "syntax", "values")

    def __init__(self, props: Sequence[tuple[str, Node, bool]], syntax: Syntax) -> None:
        """``props``: (key as JSON text with its quotes, value node, required) in order."""
        self.keys = tuple(key for key, _, _ in props)
        self.values = tuple(value for _, value, _ in props)
        self.syntax = syntax
        required = [req for _, _, req in props]
        # next_keys[i]: the properties that may come next when i.. are still to come (up to
        # and including the first required one); closable_from[i]: no required one left.
        self.next_keys: list[tuple[int, ...]] = []
        self.closable_from: list[bool] = []
        for i in range(len(props) + 1):
            upto = next((j for j in range(i, len(props)) if required[j]), len(props) - 1)
            self.next_keys.append(tuple(range(i, upto + 1)))
            self.closable_from.append(not any(required[i:]))

    def start(self) -> tuple[Frame, ...]:
        return (ObjFrame(self, _OPEN, 0, (), 0),)


@dataclass(eq=False, slots=True)
class MapObj:
    """A free-form object: any string keys, every value matching ``values``."""

    values: Node
    syntax: Syntax
    key: Str = field(default_factory=lambda: Str(0, None))

    def start(self) -> tuple[Frame, ...]:
        return (MapFrame(self, _OPEN),)


@dataclass(eq=False, slots=True)
class Union:
    """Alternatives told apart by their first character (``type`` lists, any value)."""

    dispatch: dict[str, Node]

    def start(self) -> tuple[Frame, ...]:
        return (UnionFrame(self),)


Node: TypeAlias = Lit | Seq | Switch | Str | Num | Enum | Arr | Obj | MapObj | Union


def first_chars(node: Node) -> frozenset[str]:
    """The characters a value of ``node`` can start with."""
    if isinstance(node, Str):
        return frozenset('"')
    if isinstance(node, Num):
        return frozenset(_DIGITS + "-")
    if isinstance(node, Enum):
        return frozenset(text[0] for text in node.options)
    if isinstance(node, Arr):
        return frozenset("[")
    if isinstance(node, Obj | MapObj):
        return frozenset("{")
    if isinstance(node, Union):
        return frozenset(node.dispatch)
    if isinstance(node, Lit):
        return frozenset(node.text[:1])
    if isinstance(node, Switch):
        return frozenset(text[0] for text in node.texts)
    return first_chars(node.parts[0])


# --- frames: the automaton's state, one per open construct ---------------------------------
#
# ``feed(ch)`` returns None (reject) or ``(consumed, replacement)``: the frame is replaced by
# ``replacement`` (bottom first); when ``consumed`` is false the character goes on to the
# new top (a frame that ended, or a child just pushed).

Step: TypeAlias = "tuple[bool, tuple[Frame, ...]] | None"
_DONE: Step = (True, ())
_END: Step = (False, ())
_OPEN, _FIRST, _NEXT, _KEY, _COLON, _AFTER = range(6)
_N_START, _N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_EXP, _N_EXP_SIGN, _N_EXP_DIGITS = range(9)
_N_ENDABLE = frozenset({_N_ZERO, _N_INT, _N_FRAC, _N_EXP_DIGITS})


class LitFrame(NamedTuple):
    node: Lit
    pos: int

    def feed(self, ch: str) -> Step:
        text = self.node.text
        if self.node.atomic or text[self.pos] != ch:
            return None
        return _DONE if self.pos + 1 == len(text) else (True, (LitFrame(self.node, self.pos + 1),))


class SwitchFrame(NamedTuple):
    node: Switch
    pos: int
    cands: tuple[int, ...]

    def feed(self, ch: str) -> Step:
        texts, pos = self.node.texts, self.pos
        keep = tuple(i for i in self.cands if texts[i][pos] == ch)
        if not keep:
            return None
        if len(keep) == 1 and len(texts[keep[0]]) == pos + 1:
            return (True, self.node.nexts[keep[0]].start())
        return (True, (SwitchFrame(self.node, pos + 1, keep),))


class StrFrame(NamedTuple):
    node: Str
    chars: int  # characters so far (capped at min_len when there is no max_len)
    esc: int  # -1 before the quote, 0 plain, 1 after "\", 2..5 hex digit 1..4, 6 after "\ud"

    def feed(self, ch: str) -> Step:
        node, esc = self.node, self.esc
        if esc == 0:
            if ch == '"':
                return _DONE if self.chars >= node.min_len else None
            if ch < " " or (node.max_len is not None and self.chars >= node.max_len):
                return None
            if ch == "\\":
                return (True, (StrFrame(node, self.chars, 1),))
            return (True, (self._bumped(),))
        if esc == -1:
            return (True, (StrFrame(node, 0, 0),)) if ch == '"' else None
        if esc == 1:
            if ch in '"\\/bfnrt':
                return (True, (self._bumped(),))
            return (True, (StrFrame(node, self.chars, 2),)) if ch == "u" else None
        if esc == 6:  # "\uD" must not start a surrogate (D800-DFFF)
            return (True, (StrFrame(node, self.chars, 4),)) if ch in "01234567" else None
        if ch not in _HEX:
            return None
        if esc == 5:
            return (True, (self._bumped(),))
        return (True, (StrFrame(node, self.chars, 6 if esc == 2 and ch in "dD" else esc + 1),))

    def _bumped(self) -> StrFrame:
        return self.after_plain(1)

    def after_plain(self, n: int) -> StrFrame:
        """This frame after ``n`` more plain characters (the caller checks ``max_len``)."""
        chars = self.chars + n
        if self.node.max_len is None:
            chars = min(chars, self.node.min_len)  # keeps a free string one state
        return StrFrame(self.node, chars, 0)


class NumFrame(NamedTuple):
    node: Num
    state: int
    digits: int  # digits so far in the current part (integer, fraction or exponent)

    def feed(self, ch: str) -> Step:
        s, digits, frac = self.state, self.digits, not self.node.integer
        new, count = -1, 0
        if ch in _DIGITS:
            if s in (_N_START, _N_MINUS):
                new, count = (_N_ZERO if ch == "0" else _N_INT), 1
            elif s == _N_INT and digits < MAX_INT_DIGITS:
                new, count = _N_INT, digits + 1
            elif (s == _N_DOT) or (s == _N_FRAC and digits < MAX_FRACTION_DIGITS):
                new, count = _N_FRAC, digits + 1
            elif s in (_N_EXP, _N_EXP_SIGN) or (s == _N_EXP_DIGITS and digits < MAX_EXP_DIGITS):
                new, count = _N_EXP_DIGITS, digits + 1
        elif ch == "-" and s in (_N_START, _N_EXP):
            new = _N_MINUS if s == _N_START else _N_EXP_SIGN
        elif ch == "+" and s == _N_EXP:
            new = _N_EXP_SIGN
        elif ch == "." and frac and s in (_N_ZERO, _N_INT):
            new = _N_DOT
        elif ch in "eE" and frac and s in (_N_ZERO, _N_INT, _N_FRAC):
            new = _N_EXP
        if new >= 0:
            return (True, (NumFrame(self.node, new, count),))
        return _END if s in _N_ENDABLE else None


class EnumFrame(NamedTuple):
    node: Enum
    pos: int
    cands: tuple[int, ...]

    def feed(self, ch: str) -> Step:
        options, pos = self.node.options, self.pos
        keep = tuple(i for i in self.cands if len(options[i]) > pos and options[i][pos] == ch)
        if keep:
            return (True, (EnumFrame(self.node, pos + 1, keep),))
        return _END if _enum_can_end(self) else None


class ArrFrame(NamedTuple):
    node: Arr
    phase: int
    n: int

    def feed(self, ch: str) -> Step:
        node, phase, n = self.node, self.phase, self.n
        if phase == _OPEN:
            return (True, (ArrFrame(node, _FIRST, 0),)) if ch == "[" else None
        if phase == _AFTER:
            room = node.max_items is None or n < node.max_items
            if ch == "," and room:
                return (True, (ArrFrame(node, _NEXT, n), *node.syntax.rest(node.syntax.item)))
            return _DONE if ch == "]" and n >= node.min_items else None
        if phase == _FIRST and ch == "]":
            return _DONE if node.min_items == 0 else None
        if node.max_items is not None and n >= node.max_items:
            return None
        return (False, (ArrFrame(node, _AFTER, n + 1), *node.items.start()))


class ObjFrame(NamedTuple):
    node: Obj
    phase: int
    at: int  # next property that may still come; in _KEY/_COLON the key being read
    cands: tuple[int, ...]  # _KEY: the keys still matching
    pos: int  # _KEY: characters of the key read so far

    def feed(self, ch: str) -> Step:
        node, phase, at = self.node, self.phase, self.at
        if phase == _KEY:
            keys, pos = node.keys, self.pos
            keep = tuple(j for j in self.cands if keys[j][pos] == ch)
            if not keep:
                return None
            if len(keep) == 1 and len(keys[keep[0]]) == pos + 1:
                return (True, (ObjFrame(node, _COLON, keep[0], (), 0),))
            return (True, (ObjFrame(node, _KEY, at, keep, pos + 1),))
        if phase == _COLON:
            if ch != ":":
                return None
            after = ObjFrame(node, _AFTER, at + 1, (), 0)
            rest = node.syntax.rest(node.syntax.key)
            return (True, (after, *node.values[at].start(), *rest))
        if phase == _AFTER:
            if ch == "," and at < len(node.keys):
                return (
                    True,
                    (ObjFrame(node, _NEXT, at, (), 0), *node.syntax.rest(node.syntax.item)),
                )
            return _DONE if ch == "}" and node.closable_from[at] else None
        if phase == _OPEN:
            return (True, (ObjFrame(node, _FIRST, 0, (), 0),)) if ch == "{" else None
        if ch == '"' and node.next_keys[at]:
            return (True, (ObjFrame(node, _KEY, at, node.next_keys[at], 1),))
        if ch == "}" and phase == _FIRST and node.closable_from[at]:
            return _DONE
        return None


class MapFrame(NamedTuple):
    node: MapObj
    phase: int

    def feed(self, ch: str) -> Step:
        node, phase, syntax = self.node, self.phase, self.node.syntax
        if phase == _OPEN:
            return (True, (MapFrame(node, _FIRST),)) if ch == "{" else None
        if phase == _COLON:
            if ch != ":":
                return None
            return (True, (MapFrame(node, _AFTER), *node.values.start(), *syntax.rest(syntax.key)))
        if phase == _AFTER:
            if ch == ",":
                return (True, (MapFrame(node, _NEXT), *syntax.rest(syntax.item)))
            return _DONE if ch == "}" else None
        if ch == "}" and phase == _FIRST:
            return _DONE
        return (False, (MapFrame(node, _COLON), *node.key.start())) if ch == '"' else None


class UnionFrame(NamedTuple):
    node: Union

    def feed(self, ch: str) -> Step:
        chosen = self.node.dispatch.get(ch)
        return None if chosen is None else (False, chosen.start())


Frame: TypeAlias = (
    LitFrame
    | SwitchFrame
    | StrFrame
    | NumFrame
    | EnumFrame
    | ArrFrame
    | ObjFrame
    | MapFrame
    | UnionFrame
)
State: TypeAlias = tuple[Frame, ...]


def step(state: State, ch: str) -> State | None:
    """The state after one more character, or ``None`` if it cannot follow ``state``."""
    while state:
        result = state[-1].feed(ch)
        if result is None:
            return None
        consumed, replacement = result
        state = state[:-1] + replacement
        if consumed:
            return state
    return None  # everything closed: nothing may follow


def can_finish(state: State) -> bool:
    """True when the text so far is a complete value (every open frame may end here)."""
    return all(
        (isinstance(f, NumFrame) and f.state in _N_ENDABLE)
        or (isinstance(f, EnumFrame) and _enum_can_end(f))
        for f in state
    )


def _enum_can_end(frame: EnumFrame) -> bool:
    return any(len(frame.node.options[i]) == frame.pos for i in frame.cands)
