"""Each setting declared once. A configuration dataclass field made by `option(...)` carries its
default, flags, choices, check, help and environment variable; from that one declaration come
the command line (`add_options`), the `LLM(...)` keywords (the fields' names), the validation
(`check_options`, called by each config's `__post_init__`, so a value is checked in one place
before anything loads) and the table in docs/configuration.md (`markdown_table`).

Argparse is given no defaults and no choices: a flag left out is absent from the namespace, so
the dataclass default applies, and a bad value is refused by the config's check in the same words
as `LLM(...)` gets (`--flag must be …, got …`).
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from radixserve.settings import EnvSetting

_META = "radixserve.option"


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]  # the first is the one help and errors name; the others are aliases
    help: str
    choices: tuple[str, ...] | None = None
    # a value's fault in words ("must be positive"), or None; run on non-None values only
    check: Callable[[Any], str | None] | None = None
    parse: Callable[[str], Any] | None = None  # argparse's type (None: a switch, or text)
    # switches: what the flag stores (a bool field); `hidden` flags are accepted, not listed
    store: Any = None
    hidden: tuple[str, ...] = ()
    env: EnvSetting | None = None  # the environment variable the default is read from
    default_text: str = ""  # how help and docs show a default that is computed or None
    metavar: str | None = None
    # argparse's nargs: a list-valued setting (its value a tuple of what `parse` makes)
    nargs: str | None = None

    @property
    def flag(self) -> str:
        return self.flags[0]


def option(default: Any, *flags: str, help: str, choices: Iterable[str] | None = None,
           check: Callable[[Any], str | None] | None = None, parse: Callable[[str], Any] | None = None,
           store: Any = None, hidden: Iterable[str] = (), env: EnvSetting | None = None,
           default_text: str = "", metavar: str | None = None, nargs: str | None = None) -> Any:
    """A dataclass field declared as a setting. `default` may be a zero-argument callable (read
    when a config is made, e.g. from `env`)."""
    # NOTE: a switch's default names the state it leaves ("overlap on"), not the flag's
    assert store is None or default_text, f"{flags[0]}: a switch says its default in words"
    opt = Option(tuple(flags), help, tuple(choices) if choices is not None else None, check,
                 parse, store, tuple(hidden), env, default_text, metavar, nargs)
    if callable(default):
        return dataclasses.field(default_factory=default, metadata={_META: opt})
    return dataclasses.field(default=default, metadata={_META: opt})


def options_of(cls: type) -> Iterator[tuple[dataclasses.Field, Option]]:
    """Each declared setting of a config dataclass, in declaration order."""
    for f in dataclasses.fields(cls):
        if _META in f.metadata:
            yield f, f.metadata[_META]


def declared(cls: type, name: str) -> Option:
    for f, opt in options_of(cls):
        if f.name == name:
            return opt
    raise KeyError(f"{cls.__name__} declares no setting {name!r}")


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    return str(value)


def default_text(f: dataclasses.Field, opt: Option) -> str:
    """The default as help and docs show it."""
    if opt.default_text:
        return opt.default_text
    if f.default_factory is not dataclasses.MISSING:
        return _shown(f.default_factory())
    return _shown(f.default)


def _type_fault(opt: Option, value: Any) -> str | None:
    if opt.nargs is not None:  # a list: each item as a single value of the setting would be
        if not isinstance(value, (list, tuple)):
            return "must be a list"
        item = dataclasses.replace(opt, nargs=None)
        return next((why for v in value if (why := _type_fault(item, v)) is not None), None)
    if opt.store is not None:
        return None if isinstance(value, bool) else "must be true or false"
    if isinstance(value, bool):
        return "must be a number" if opt.parse in (int, float) else "must be a string"
    if opt.parse is int:
        return None if isinstance(value, int) else "must be an integer"
    if opt.parse is float:
        return None if isinstance(value, (int, float)) else "must be a number"
    return None if isinstance(value, str) else "must be a string"


def value_fault(opt: Option, value: Any) -> str | None:
    """What is wrong with `value` for this setting, in words ending with the value given
    (`must be a power of two, got 3`), or None: the one check of every setting's value."""
    if value is None:
        return None
    why = _type_fault(opt, value)
    if why is None and opt.choices is not None and value not in opt.choices:
        why = f"must be one of {', '.join(opt.choices)}"
    if why is None and opt.check is not None:
        why = opt.check(value)
    if why is None:
        return None
    got = repr(value)
    if got in why or why.startswith(f"{value}: "):  # the reason quotes the value itself
        return why
    return f"{why}, got {got if len(got) <= 60 else got[:60] + '…'}"


def check_options(config: Any) -> None:
    """ValueError naming the first field whose value its declaration refuses (`name must …,
    got …`). Every config checks itself so when it is made; the command line has the choice
    settings checked as it parses them, by the same `value_fault`."""
    for f, opt in options_of(type(config)):
        if (why := value_fault(opt, getattr(config, f.name))) is not None:
            raise ValueError(f"{f.name} {why}")


def flag_of(classes: Iterable[type], name: str) -> str | None:
    """The flag of field `name` in any of `classes`, or None."""
    for cls in classes:
        for f, opt in options_of(cls):
            if f.name == name:
                return opt.flag
    return None


# --- checks, each a value's fault in words ---

def at_least(low: float) -> Callable[[Any], str | None]:
    return lambda v: None if v >= low else f"must be at least {low:g}"


def positive(v: float) -> str | None:
    return None if v > 0 else "must be positive"


def non_negative(v: float) -> str | None:
    return None if v >= 0 else "must be non-negative"


def within(low: float, high: float, *, open_low: bool = False) -> Callable[[Any], str | None]:
    def check(v: float) -> str | None:
        ok = (low < v if open_low else low <= v) and v <= high
        return None if ok else f"must be in {'(' if open_low else '['}{low:g}, {high:g}]"
    return check


def power_of_two(v: int) -> str | None:
    return None if v >= 1 and not v & (v - 1) else "must be a power of two"


# --- the command line ---

def _help(f: dataclasses.Field, opt: Option) -> str:
    env = f"; env {opt.env.name}" if opt.env is not None else ""
    return f"{opt.help} (default: {default_text(f, opt)}{env})".replace("%", "%%")


def _parser(opt: Option) -> Callable[[str], Any]:
    """argparse's `type`: the text converted; a choice setting's value checked here already, so
    that the command line refuses it as it refuses any unknown word (one line, exit code 2)."""
    convert = opt.parse or str
    if opt.choices is None:
        return convert

    def parse(text: str) -> Any:
        value = convert(text)
        if (why := value_fault(opt, value)) is not None:
            raise argparse.ArgumentTypeError(why)
        return value

    parse.__name__ = convert.__name__  # (argparse names the type in its own messages)
    return parse


def add_options(parser: argparse.ArgumentParser, cls: type,
                only: Iterable[str] | None = None) -> None:
    """Every declared setting of `cls` (or those named in `only`) as a flag of `parser`."""
    names = set(only) if only is not None else None
    for f, opt in options_of(cls):
        if names is not None and f.name not in names:
            continue
        if opt.store is not None:
            parser.add_argument(*opt.flags, dest=f.name, action="store_const", const=opt.store,
                                default=argparse.SUPPRESS, help=_help(f, opt))
            for hidden in opt.hidden:
                parser.add_argument(hidden, dest=f.name, action="store_const", const=not opt.store,
                                    default=argparse.SUPPRESS, help=argparse.SUPPRESS)
            continue
        metavar = opt.metavar or ("{" + ",".join(opt.choices) + "}" if opt.choices else None)
        parser.add_argument(*opt.flags, dest=f.name, type=_parser(opt), nargs=opt.nargs,
                            default=argparse.SUPPRESS, metavar=metavar, help=_help(f, opt))


def values_from_args(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The settings of `cls` given on the command line (those left out are absent); a
    list-valued one as a tuple."""
    return {f.name: tuple(v) if opt.nargs is not None else v
            for f, opt in options_of(cls) if (v := getattr(args, f.name, _ABSENT)) is not _ABSENT}


_ABSENT = object()


def markdown_table(classes: Iterable[type], field_header: str) -> str:
    """docs/configuration.md's table of flags, from the declarations."""
    rows = [f"| flag | {field_header} | default | meaning |", "|---|---|---|---|"]
    for cls in classes:
        for f, opt in options_of(cls):
            flags = ", ".join(f"`{x}`" for x in opt.flags)
            meaning = opt.help
            if opt.choices:
                meaning += f" (one of {', '.join(f'`{c}`' for c in opt.choices)})"
            if opt.env is not None:
                meaning += f"; env `{opt.env.name}`"
            if opt.store is not None:
                meaning += f" (the flag sets `{f.name}={opt.store}`)"
            default = f"`{default_text(f, opt)}`" if not opt.default_text else default_text(f, opt)
            rows.append(f"| {flags} | `{f.name}` | {default} | {meaning.replace('|', '&#124;')} |")
    return "\n".join(rows) + "\n"
