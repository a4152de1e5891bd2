"""Questions the CLI asks when a flag is missing, as natscli asks them with survey:
``? Storage [file, memory] (file)``.  The answer is read from stdin, so a script can
pipe answers in; at end of input the default stands, and a question without a default
fails with a line saying which flag to give instead.  Prompts go to stderr so that
``--json`` output on stdout stays clean.
"""
from __future__ import annotations

import sys

from natsjs.admin.errors import CLIError


def _out(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def _readline() -> str | None:
    line = sys.stdin.readline() if sys.stdin is not None else ""
    if not line:
        return None
    return line.rstrip("\r\n")


def ask(message: str, default: str | None = None, required: bool = False,
        flag: str = "") -> str:
    hint = " (%s)" % default if default not in (None, "") else ""
    _out("? %s%s " % (message, hint))
    answer = _readline()
    if answer is None:
        _out("\n")
        if default is None and required:
            raise CLIError("no answer for %r; pass %s" % (message, flag or "it as a flag"))
        return default or ""
    answer = answer.strip()
    if not answer:
        if required and not default:
            raise CLIError("a value is required for %r" % message)
        return default or ""
    return answer


def select(message: str, options: list[str], default: str | None = None,
           flag: str = "") -> str:
    """Pick one of ``options`` by its text or its 1-based number."""
    if not options:
        raise CLIError("nothing to select for %r" % message)
    tty = sys.stdin is not None and sys.stdin.isatty()
    if tty:
        for i, o in enumerate(options, 1):
            _out("  %d) %s\n" % (i, o))
    hint = " (%s)" % default if default else ""
    _out("? %s [%s]%s " % (message, ", ".join(options), hint))
    while True:
        answer = _readline()
        if answer is None:
            _out("\n")
            if default is None:
                raise CLIError("no answer for %r; pass %s" % (message, flag or "it as an argument"))
            choice = default
            break
        answer = answer.strip()
        if not answer and default is not None:
            choice = default
            break
        if answer.isdigit() and 1 <= int(answer) <= len(options):
            choice = options[int(answer) - 1]
            break
        matches = [o for o in options if o.lower() == answer.lower()]
        if matches:
            choice = matches[0]
            break
        if not tty:
            raise CLIError("%r is not one of %s" % (answer, ", ".join(options)))
        _out("? %s [%s] " % (message, ", ".join(options)))
    if not tty:
        _out("\n")
    _out("? %s %s\n" % (message, choice))
    return choice


def confirm(message: str, default: bool = False) -> bool:
    _out("? %s (%s) " % (message, "Y/n" if default else "y/N"))
    answer = _readline()
    if answer is None:
        _out("\n")
        return default
    answer = answer.strip().lower()
    if not answer:
        return default
    return answer in ("y", "yes", "true")
