"""What both server command lines share: ``HOLDFAST_*`` environment variables for
every flag, ``--log-level``/``--log-format`` (text or JSON lines), ``--version``,
and errors that name flags rather than the fields behind them."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import NoReturn

from holdfast.server.serve import version_text

ENV_PREFIX = "HOLDFAST_"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line naming the flag, and exit code 2
    (``holdfast-pool: error: argument --unbind-delay: invalid float value: 'abc' (see
    holdfast-pool --help)``): the usage is what ``--help`` prints, not every mistake."""

    def error(self, message: str) -> NoReturn:
        top = self.prog.split()[0]
        self.exit(2, f"{self.prog}: error: {message} (see {top} --help)\n")


def whole_number(minimum: int, note: str = "", maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for a whole number in [``minimum``, ``maximum``]: refused by
    argparse, the error names the flag (and a ``HOLDFAST_*`` variable's value is checked
    the same way). ``note`` follows the bound in the error ("(0 clears it)")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}{note}, got {text}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {text[:40]}")
        return value

    return parse


def seconds(
    maximum: float, *, zero: bool = False, minimum: float | None = None
) -> Callable[[str], float]:
    """An argparse ``type`` for a duration in (0, ``maximum``] ([0, ``maximum``] with
    ``zero``, [``minimum``, ``maximum``] with ``minimum``): refused by argparse, the error
    names the flag (or is reached through its ``HOLDFAST_*`` variable). NaN, infinity and
    a huge value are refused with the rest: accepted, they overflowed later (an int of
    milliseconds, a timer) far from the flag."""
    floor = f">= {minimum:g}" if minimum is not None else ">= 0" if zero else "> 0"

    def above_floor(value: float) -> bool:
        if minimum is not None:
            return value >= minimum
        return value >= 0 if zero else value > 0

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds, got {text[:40]!r}"
            ) from None
        if not (above_floor(value) and value <= maximum):
            raise argparse.ArgumentTypeError(
                f"must be {floor} and at most {maximum:.0f} seconds, got {text[:40]}"
            )
        return value

    return parse


def env_name(action: argparse.Action) -> str:
    """``--dedup-window`` -> ``HOLDFAST_DEDUP_WINDOW``."""
    longest = max(action.option_strings, key=len)
    return ENV_PREFIX + longest.lstrip("-").upper().replace("-", "_")


def add_common_flags(parser: argparse.ArgumentParser, program: str) -> None:
    """``--version``, ``--log-level`` and ``--log-format`` for a server."""
    parser.add_argument("--version", action="version", version=version_text(program))
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="(default: %(default)s)",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text lines, or one JSON object a line (time, level, logger, message) "
        "(default: %(default)s)",
    )


class EnvValue(str):
    """A flag's default taken from ``HOLDFAST_<FLAG>``: argparse converts a string default
    with the flag's ``type`` only when the flag is not on the command line, and passes
    this very object, so the ``type`` knows an error is the variable's to name."""

    variable: str

    def __new__(cls, text: str, variable: str) -> EnvValue:
        value = super().__new__(cls, text)
        value.variable = variable
        return value


def _naming_variable(action: argparse.Action) -> Callable[[str], object]:
    """``action``'s type, whose errors for a value from the environment name the variable,
    and which checks ``choices`` there too (argparse checks them only on the command line:
    ``HOLDFAST_SYNC=fast`` reached the configuration check, which named neither)."""
    convert = action.type
    choices = action.choices

    def parse(text: str) -> object:
        try:
            value = text if convert is None else convert(text)  # type: ignore[operator]
        except (argparse.ArgumentTypeError, ValueError, TypeError) as error:
            if not isinstance(text, EnvValue):
                raise
            why = (
                str(error)
                if isinstance(error, argparse.ArgumentTypeError)
                else f"invalid {parse.__name__} value: {text!r}"
            )
            raise argparse.ArgumentTypeError(f"{why} (from {text.variable})") from None
        if isinstance(text, EnvValue) and choices is not None and value not in choices:
            allowed = ", ".join(map(str, choices))
            raise argparse.ArgumentTypeError(
                f"must be one of {allowed}, got {text!r} (from {text.variable})"
            )
        return value

    # argparse names a failing type in its error ("invalid float value"): keep the name.
    parse.__name__ = getattr(convert, "__name__", "str")
    return parse


def apply_environment(
    parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None
) -> None:
    """Let ``HOLDFAST_<FLAG>`` set each flag's default (a flag given on the command line
    still wins), and say so in ``--help``. argparse converts and checks an environment
    value as it would the flag's own, and its error names the flag and the variable."""
    environ = os.environ if environ is None else environ
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "version"):
            continue
        name = env_name(action)
        action.help = f"{action.help or ''} [env {name}]".strip()
        if name in environ:
            action.default = EnvValue(environ[name], name)
            action.type = _naming_variable(action)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time``, ``level``, ``logger``, ``message`` (+ ``error``)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str, log_format: str) -> None:
    """Log to stderr at ``level``, as text lines or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=level, handlers=[handler], force=True)


def name_flags(message: str, flags: Mapping[str, str]) -> str:
    """Replace the field names a value object's check used by the flags that set them
    (whole names only: ``listen`` is not replaced inside ``metrics_listen``)."""
    for field, flag in flags.items():
        message = re.sub(rf"(?<![\w.-]){re.escape(field)}(?![\w])", flag, message)
    return message
