"""``natsjs stream find|subjects|gaps``: questions about streams and what they hold.

``find`` filters the account's streams as jsm.go's QueryStreams does (server and
cluster names by regular expression, empty, idle, age, consumers, subject, replicas,
sourced, mirrored, leader, API level, ``--invert``) and ``--expression`` takes a
boolean expression over the stream info's JSON (``config``, ``state``, ``info``) in
the part of the expr language natscli's examples use: comparisons, ``in``,
``and``/``&&``, ``or``/``||``, ``not``/``!``, field access, lists, ``len()``,
``contains``, ``startsWith``, ``endsWith`` and ``matches``.  ``subjects`` counts the
messages per subject (STREAM.INFO with ``subjects_filter``, paged); ``gaps`` lists
the ranges of deleted messages (from ``deleted_details``, walking the stream when the
server listed only some).
"""
from __future__ import annotations

import ast
import re

from natsjs.admin import prompt
from natsjs.admin.args import json_flag
from natsjs.admin.errors import CLIError, q
from natsjs.admin.jsapi import ordered_read
from natsjs.admin.render import Table, comma, ibytes, parse_duration, parse_time, print_json
from natsjs.admin.stream import pick_stream, streams_table

NS = 1_000_000_000


def register(g) -> None:
    p = g.command("find", "Finds streams matching certain criteria", find, aliases=["query"])
    p.add_argument("--server-name", default="",
                   help="Display streams present on a regular expression matched server")
    p.add_argument("--cluster", default="",
                   help="Display streams present on a regular expression matched cluster")
    p.add_argument("--empty", action="store_true", help="Display streams with no messages")
    p.add_argument("--idle", default="", metavar="DURATION",
                   help="Display streams with no new messages or consumer deliveries for a "
                        "period")
    p.add_argument("--created", default="", metavar="DURATION",
                   help="Display streams created longer ago than duration")
    p.add_argument("--consumers", type=int, default=-1, metavar="THRESHOLD",
                   help="Display streams with fewer consumers than threshold")
    p.add_argument("--subject", default="",
                   help="Filters streams by those with interest matching a subject or wildcard")
    p.add_argument("--replicas", type=int, default=0, metavar="REPLICAS",
                   help="Display streams with fewer or equal replicas than the value")
    p.add_argument("--sourced", action="store_true",
                   help="Display that sources data from other streams")
    p.add_argument("--mirrored", action="store_true",
                   help="Display that mirrors data from other streams")
    p.add_argument("--leader", default="", metavar="SERVER",
                   help="Display only clustered streams with a specific leader")
    p.add_argument("-n", "--names", action="store_true", help="Show just the stream names")
    p.add_argument("--invert", action="store_true",
                   help="Invert the check - before becomes after, with becomes without")
    p.add_argument("--expression", default="", help="Match streams using an expression language")
    p.add_argument("--api-level", type=int, default=0,
                   help="Match streams that support at least the given api level")

    p = g.command("subjects", "Query subjects held in a stream", subjects, aliases=["subj"])
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("filter", nargs="?", default=">",
                   help="Limit the subjects to those matching a filter")
    json_flag(p)
    p.add_argument("--sort", default="messages", choices=["name", "subjects", "messages",
                                                          "count"],
                   help="Adjusts the sorting order (name, messages)")
    p.add_argument("-R", "--reverse", action="store_true", help="Reverse sort servers")
    p.add_argument("--names", action="store_true", help="List only subject names")

    p = g.command("gaps", "Detect gaps in the stream content that would be reported as "
                  "deleted messages", gaps)
    p.add_argument("stream", nargs="?", help="Stream to act on")
    p.add_argument("-f", "--force", action="store_true", help="Act without prompting")
    p.add_argument("--progress", action=__import__("argparse").BooleanOptionalAction,
                   default=True, help="Enable progress bar")
    p.add_argument("--json", action="store_true", help="Show detected gaps in JSON format")


# ---- find ---------------------------------------------------------------------------------


def subject_is_subset_match(subject: str, test: str) -> bool:
    """jsm.go SubjectIsSubsetMatch: every subject of ``subject`` is matched by ``test``."""
    tokens, tests = subject.split("."), test.split(".")
    for i, t2 in enumerate(tests):
        if i >= len(tokens) or not t2:
            return False
        if t2 == ">":
            return True
        t1 = tokens[i]
        if not t1 or t1 == ">":
            return False
        if t1 == "*":
            if t2 != "*":
                return False
            continue
        if t2 != "*" and t1 != t2:
            return False
    return len(tokens) == len(tests)


def _regexp(text: str, what: str):
    if not text:
        return None
    try:
        return re.compile(text)
    except re.error as e:
        raise CLIError("invalid %s expression %s: %s" % (what, q(text), e)) from None


def _replicas_of(info: dict) -> list[str]:
    cl = info.get("cluster") or {}
    return [r.get("name", "") for r in cl.get("replicas") or []]


def stream_matches(info: dict, a, now_ns: int, expr=None) -> bool:
    """One stream against every filter given (each inverted by --invert), in jsm.go's
    order of matchers."""
    inv = a.invert
    cfg = info.get("config") or {}
    st = info.get("state") or {}
    cl = info.get("cluster")

    def keep(hit: bool) -> bool:
        return hit != inv

    if expr is not None and not expr.test(info):
        return False
    if a.created:
        age = now_ns - _ns(info.get("created"))
        limit = _dur(a.created)
        if not (age <= limit if inv else age >= limit):
            return False
    if a.idle:
        if not keep(now_ns - _ns(st.get("last_ts")) > _dur(a.idle)):
            return False
    if a.empty and not keep(st.get("messages", 0) == 0):
        return False
    if a.consumers >= 0:
        n = st.get("consumer_count", 0)
        if not (n >= a.consumers if inv else n <= a.consumers):
            return False
    cluster_re = _regexp(a.cluster, "cluster")
    if cluster_re is not None:
        if not keep(bool(cl) and bool(cluster_re.search(cl.get("name", "")))):
            return False
    if a.subject:
        hits = [subject_is_subset_match(s, a.subject) for s in cfg.get("subjects") or []]
        if not any((not h) if inv else h for h in hits):
            return False
    server_re = _regexp(a.server_name, "server name")
    if server_re is not None:
        names = ([cl.get("leader", "")] + _replicas_of(info)) if cl else []
        if not keep(any(server_re.search(n) for n in names if n)):
            return False
    if a.replicas:
        r = cfg.get("num_replicas") or 1
        if not (r >= a.replicas if inv else r <= a.replicas):
            return False
    if a.sourced and not keep(bool(cfg.get("sources"))):
        return False
    if a.mirrored and not keep(bool(cfg.get("mirror"))):
        return False
    if a.leader:
        if not cl:
            return False
        if not keep(cl.get("leader") == a.leader):
            return False
    if a.api_level > 0:
        level = (cfg.get("metadata") or {}).get("_nats.req.level") or "0"
        try:
            level = int(level)
        except ValueError:
            raise CLIError("invalid _nats.req.level metadata value %s" % q(level)) from None
        if not keep(level >= a.api_level):
            return False
    return True


def _ns(text) -> int:
    t = parse_time(text)
    return int(t.timestamp()) * NS + t.microsecond * 1000 if t else 0


def _dur(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError:
        raise CLIError("invalid duration %s" % q(text)) from None


async def find(rt) -> None:
    import time
    a = rt.args
    expr = Expression(a.expression) if a.expression else None
    js = await rt.js()
    infos, _last = await js.paged("STREAM.LIST", "streams")
    now = time.time_ns()
    found = [i for i in infos if stream_matches(i, a, now, expr)]
    if a.names:
        print("\n".join(sorted(i["config"]["name"] for i in found)))
        return
    streams_table(found, a.subject)


# ---- the expression language (a safe subset of expr-lang) ---------------------------------


class Expression:
    """A boolean expression over a stream info's ``config``, ``state`` and ``info``,
    parsed once into a Python syntax tree (after spelling expr's operators as Python's)
    and evaluated by walking only the node kinds listed here: nothing is executed."""

    _WORDS = {"&&": " and ", "||": " or ", "nil": "None", "true": "True", "false": "False"}
    _INFIX = ("contains", "startsWith", "endsWith", "matches")

    def __init__(self, text: str):
        self.text = text
        try:
            self.tree = ast.parse(self._python(text), mode="eval").body
        except SyntaxError as e:
            raise CLIError("invalid expression %s: %s" % (q(text), e.msg)) from None
        self._check(self.tree)

    def _python(self, text: str) -> str:
        out = []
        i = 0
        n = len(text)
        while i < n:
            c = text[i]
            if c in "\"'`":
                j = i + 1
                while j < n and text[j] != c:
                    j += 2 if text[j] == "\\" else 1
                lit = text[i:j + 1]
                out.append(repr(lit[1:-1]) if c == "`" else lit)
                i = j + 1
                continue
            two = text[i:i + 2]
            if two in ("&&", "||"):
                out.append(self._WORDS[two])
                i += 2
                continue
            if c == "!" and text[i + 1:i + 2] != "=":
                out.append(" not ")
                i += 1
                continue
            m = re.match(r"[A-Za-z_][A-Za-z_0-9]*", text[i:])
            if m:
                word = m.group(0)
                if word in self._INFIX:
                    out.append(" %% %s %% " % repr(word))   # a marker, see _infix
                else:
                    out.append(self._WORDS.get(word, word))
                i += len(word)
                continue
            out.append(c)
            i += 1
        return "".join(out).strip()

    _NODES = (ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare,
              ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn,
              ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Mod, ast.Attribute,
              ast.Subscript, ast.Name, ast.Load, ast.Constant, ast.List, ast.Tuple, ast.Call,
              ast.IfExp)

    def _check(self, node) -> None:
        for sub in ast.walk(node):
            if not isinstance(sub, self._NODES):
                raise CLIError("invalid expression %s: %s is not supported"
                               % (q(self.text), type(sub).__name__))
            if isinstance(sub, ast.Name) and sub.id not in ("config", "state", "info", "len",
                                                            "None", "True", "False"):
                raise CLIError("invalid expression %s: unknown name %s"
                               % (q(self.text), q(sub.id)))
            if isinstance(sub, ast.Call) and not (isinstance(sub.func, ast.Name) and
                                                  sub.func.id == "len"):
                raise CLIError("invalid expression %s: only len() may be called"
                               % q(self.text))

    def test(self, info: dict) -> bool:
        env = {"config": info.get("config") or {}, "state": info.get("state") or {},
               "info": info}
        try:
            value = self._eval(self.tree, env)
        except (TypeError, ValueError, KeyError, re.error) as e:
            raise CLIError("expression %s failed: %s" % (q(self.text), e)) from None
        if not isinstance(value, bool):
            raise CLIError("expression %s did not return a boolean" % q(self.text))
        return value

    def _eval(self, node, env):
        ev = self._eval
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env.get(node.id, {"None": None, "True": True, "False": False}.get(node.id))
        if isinstance(node, (ast.List, ast.Tuple)):
            return [ev(e, env) for e in node.elts]
        if isinstance(node, ast.Attribute):
            base = ev(node.value, env)
            return base.get(node.attr) if isinstance(base, dict) else None
        if isinstance(node, ast.Subscript):
            base, key = ev(node.value, env), ev(node.slice, env)
            if isinstance(base, dict):
                return base.get(key)
            if isinstance(base, (list, str)) and isinstance(key, int):
                return base[key] if -len(base) <= key < len(base) else None
            return None
        if isinstance(node, ast.Call):
            v = ev(node.args[0], env) if node.args else None
            return len(v) if v is not None else 0
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return all(ev(v, env) for v in node.values)
            return any(ev(v, env) for v in node.values)
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand, env)
            return (not v) if isinstance(node.op, ast.Not) else -v
        if isinstance(node, ast.IfExp):
            return ev(node.body, env) if ev(node.test, env) else ev(node.orelse, env)
        if isinstance(node, ast.BinOp):
            left = node.left
            # "a contains b" was spelled a % 'contains' % b: ((a % op) % b)
            if isinstance(node.op, ast.Mod) and isinstance(left, ast.BinOp) and \
                    isinstance(left.op, ast.Mod) and isinstance(left.right, ast.Constant) \
                    and left.right.value in self._INFIX:
                return self._infix(left.right.value, ev(left.left, env), ev(node.right, env))
            a, b = ev(left, env), ev(node.right, env)
            op = node.op
            if isinstance(op, ast.Add):
                return a + b
            if isinstance(op, ast.Sub):
                return a - b
            if isinstance(op, ast.Mult):
                return a * b
            if isinstance(op, ast.Div):
                return a / b
            return a % b
        if isinstance(node, ast.Compare):
            left = ev(node.left, env)
            for op, right_node in zip(node.ops, node.comparators):
                right = ev(right_node, env)
                if not self._compare(op, left, right):
                    return False
                left = right
            return True
        raise TypeError("unsupported %s" % type(node).__name__)

    @staticmethod
    def _infix(op: str, a, b) -> bool:
        a, b = "" if a is None else str(a), "" if b is None else str(b)
        if op == "contains":
            return b in a
        if op == "startsWith":
            return a.startswith(b)
        if op == "endsWith":
            return a.endswith(b)
        return re.search(b, a) is not None

    @staticmethod
    def _compare(op, a, b) -> bool:
        if isinstance(op, ast.Eq):
            return a == b
        if isinstance(op, ast.NotEq):
            return a != b
        if isinstance(op, (ast.In, ast.NotIn)):
            hit = a in (b or [])
            return hit if isinstance(op, ast.In) else not hit
        if a is None or b is None:
            return False
        if isinstance(op, ast.Lt):
            return a < b
        if isinstance(op, ast.LtE):
            return a <= b
        if isinstance(op, ast.Gt):
            return a > b
        return a >= b


# ---- subjects -----------------------------------------------------------------------------


async def subjects(rt) -> None:
    """jsm.go StreamContainedSubjects, then natscli's table of 1, 2 or 3 column pairs."""
    a = rt.args
    asked = not a.stream
    name = await pick_stream(rt, a.stream)
    js = await rt.js()
    filt = a.filter or ">"
    counts: dict[str, int] = {}
    offset = 0
    while True:
        resp = await js.request("STREAM.INFO." + name,
                                {"subjects_filter": filt, "offset": offset},
                                doing="could not load stream %s" % name)
        page = (resp.get("state") or {}).get("subjects") or {}
        counts.update(page)
        offset += len(page)
        if not page or offset >= resp.get("total", 0):
            break
    if a.json:
        print_json(counts)
        return
    if asked:
        print()
    if not counts:
        print("No subjects found matching %s" % filt)
        return
    if a.sort in ("name", "subjects"):
        names = sorted(counts, reverse=a.reverse)
    else:
        names = sorted(counts, key=lambda s: (counts[s], s), reverse=a.reverse)
    if a.names:
        for n in names:
            print(n)
        return
    longest = max(len(n) for n in names)
    width = len(comma(max(counts.values())))
    cols = 3 if longest + width < 20 else 2 if longest + width < 30 else 1
    t = Table("%d Subjects in stream %s" % (len(names), name), ["Subject", "Count"] * cols)

    def cnt(s: str) -> str:
        return comma(counts[s]) if counts.get(s) else ""
    for i in range(0, len(names), cols):
        group = names[i:i + cols]
        row = []
        for s in group:
            row += [s, cnt(s)]
        t.add(*(row + [""] * (2 * cols - len(row))))
    t.print()


# ---- gaps ---------------------------------------------------------------------------------


def gap_ranges(deleted: list) -> list[list[int]]:
    """Consecutive deleted sequences as [first, last] ranges."""
    out: list[list[int]] = []
    for seq in sorted(deleted):
        if out and seq == out[-1][1] + 1:
            out[-1][1] = seq
        else:
            out.append([seq, seq])
    return out


async def find_gaps(js, name: str, info: dict) -> list[list[int]]:
    """The stream's deleted ranges: from the server's list of deleted sequences when
    it is complete, else by reading the stream (headers only) after what it listed."""
    st = info.get("state") or {}
    deleted = list(st.get("deleted") or [])
    if len(deleted) >= (st.get("num_deleted") or 0):
        return gap_ranges(deleted)
    start = max(deleted) + 1 if deleted else st.get("first_seq", 1)
    seqs = [m.seq for m in await ordered_read(js, name, start_seq=start, headers_only=True)]
    missing = list(deleted)
    prev = start - 1
    for s in seqs:
        missing.extend(range(prev + 1, s))
        prev = s
    missing.extend(range(prev + 1, st.get("last_seq", 0) + 1))
    return gap_ranges(missing)


async def gaps(rt) -> None:
    a = rt.args
    name = await pick_stream(rt, a.stream)
    js = await rt.js()
    info = await js.request("STREAM.INFO." + name, {"deleted_details": True},
                            doing="could not load stream %s" % name)
    st = info.get("state") or {}
    if not st.get("num_deleted"):
        if a.json:
            print("{}")
        print("No deleted messages in %s" % name)
        return
    if not a.force:
        print("WARNING: Detecting gaps in a stream consumes the entire stream and can be "
              "resource intensive on the Server, Client and Network.")
        print()
        if not prompt.confirm("Really detect gaps in stream %s with %s messages and %s bytes"
                              % (name, comma(st.get("messages", 0)),
                                 ibytes(st.get("bytes", 0))), False):
            return
    found = await find_gaps(js, name, info)
    if a.json:
        print_json(found)
        return
    if not found:
        print("No deleted messages in %s" % name)
        return
    title = "1 gap found in Stream %s" % name if len(found) == 1 else \
        "%s gaps found in Stream %s" % (comma(len(found)), name)
    t = Table(title, ["First Message", "Last Message"])
    for first, last in found:
        t.add(comma(first), comma(last))
    t.print()
