"""The admin CLI's failures: each becomes one line on stderr and a non-zero exit."""
from __future__ import annotations

import json


class CLIError(Exception):
    """A failure to report as ``natsjs: error: <message>``."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class APIError(CLIError):
    """A JetStream API error answer: its description and error code, as jsm.go's
    ApiError prints them ('stream not found (10059)')."""

    def __init__(self, err: dict, doing: str = ""):
        self.err = err or {}
        self.code_http = self.err.get("code", 0)
        self.err_code = self.err.get("err_code", 0)
        self.description = self.err.get("description", "unknown error")
        text = "%s (%d)" % (self.description, self.err_code) if self.err_code \
            else self.description
        super().__init__("%s: %s" % (doing, text) if doing else text)


def q(text) -> str:
    """Go's %q for the strings the CLI quotes: '"n1-c1"'."""
    return json.dumps(str(text), ensure_ascii=False)
