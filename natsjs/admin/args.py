"""Flags and flag values that several command families share.

``json_flag`` adds natscli's ``-j/--json``; the parsers turn a flag's text into the
number or map the JetStream API wants, or end the command with natscli's
``invalid <what> "<text>"`` line.  This module sits at the bottom of the command
modules (``stream``, ``consumer``, ``kv``, ``objstore``, ``backup``...): it imports
none of them, so each can use it without a circle.
"""
from __future__ import annotations

import argparse
import json

from natsjs.admin.errors import CLIError, q
from natsjs.admin.render import parse_bytes, parse_duration


def json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-j", "--json", action="store_true", help="Produce JSON output")


def _parsed(parse, text: str, what: str) -> int:
    try:
        return parse(text)
    except ValueError:
        raise CLIError("invalid %s %s" % (what, q(text))) from None


def size_arg(text: str, what: str) -> int:
    """A size such as ``1MB`` or ``512`` in bytes; ``what`` names the flag in the error."""
    return _parsed(parse_bytes, text, what)


def duration_arg(text: str, what: str) -> int:
    """A duration such as ``1h30m`` in nanoseconds."""
    return _parsed(parse_duration, text, what)


def int_arg(text: str, what: str) -> int:
    return _parsed(int, text, what)


def pairs_arg(values, sep: str, what: str, usage: str, strip: bool = False) -> dict:
    """Repeated ``KEY<sep>VALUE`` flags as a map; one without ``sep`` is refused as
    ``invalid <what> "X", use <usage>``; ``strip`` trims keys and values."""
    out = {}
    for v in values or []:
        if sep not in v:
            raise CLIError("invalid %s %s, use %s" % (what, q(v), usage))
        k, val = v.split(sep, 1)
        out[k.strip() if strip else k] = val.strip() if strip else val
    return out


def metadata_arg(values) -> dict:
    """``--metadata KEY=VALUE`` flags (repeated) as a map."""
    return pairs_arg(values, "=", "metadata", "KEY=VALUE")


def read_json_file(path: str, invalid: str = "invalid JSON in %s: %s"):
    """The JSON document in ``path``; ``invalid`` words the error for bad JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise CLIError("could not read %s: %s" % (path, e.strerror or e)) from None
    except ValueError as e:
        raise CLIError(invalid % (path, e)) from None


def load_config_file(path: str) -> dict:
    """A stream configuration from a JSON file (``--config``); a stream info answer
    works as well as a bare configuration."""
    cfg = read_json_file(path)
    if not isinstance(cfg, dict):
        raise CLIError("%s does not hold a JSON object" % path)
    return cfg.get("config", cfg) if "config" in cfg and "state" in cfg else cfg
