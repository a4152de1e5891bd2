"""natsjs/jetstream/gojson.py against the texts of Go's encoding/json.

Each row: an input, what a json.Decoder reading value after value reports (nats-server's
unmarshalRequest, which appends the offset; ``ok N`` when it reads N values), and what
json.Unmarshal reports (the pull request body).  The texts were produced by Go's own
encoding/json on these inputs.
"""
from __future__ import annotations

import pytest

from natsjs.jetstream.gojson import GoSyntaxError, check_valid, values

CASES = [
    (b'not json',
     "invalid character 'o' in literal null (expecting 'u') at offset 2",
     "invalid character 'o' in literal null (expecting 'u')"),
    (b'{"name":"BAD","subjects":["bad"]} trailing',
     "invalid character 'a' in literal true (expecting 'u') at offset 37",
     "invalid character 't' after top-level value"),
    (b'{', 'unexpected EOF', 'unexpected end of JSON input'),
    (b'{bad',
     "invalid character 'b' looking for beginning of object key string at offset 2",
     "invalid character 'b' looking for beginning of object key string"),
    (b'{"a":1} {"b":2}', 'ok 2', "invalid character '{' after top-level value"),
    (b'{"a":1}x',
     "invalid character 'x' looking for beginning of value at offset 8",
     "invalid character 'x' after top-level value"),
    (b'nul', 'unexpected EOF', "invalid character ' ' in literal null (expecting 'l')"),
    (b'{"a" 1}',
     "invalid character '1' after object key at offset 6",
     "invalid character '1' after object key"),
    (b'{"a":1,}',
     "invalid character '}' looking for beginning of object key string at offset 8",
     "invalid character '}' looking for beginning of object key string"),
    (b'{"a":1}}',
     "invalid character '}' looking for beginning of value at offset 8",
     "invalid character '}' after top-level value"),
    (b'{"a":tru}',
     "invalid character '}' in literal true (expecting 'e') at offset 9",
     "invalid character '}' in literal true (expecting 'e')"),
    (b'"\\x"',
     "invalid character 'x' in string escape code at offset 3",
     "invalid character 'x' in string escape code"),
    (b'\xff',
     "invalid character '\u00ff' looking for beginning of value at offset 1",
     "invalid character '\u00ff' looking for beginning of value"),
    (b'[1,]',
     "invalid character ']' looking for beginning of value at offset 4",
     "invalid character ']' looking for beginning of value"),
    (b'-', 'unexpected EOF', "invalid character ' ' in numeric literal"),
    (b'1.', 'unexpected EOF', "invalid character ' ' after decimal point in numeric literal"),
    (b'1e+', 'unexpected EOF', "invalid character ' ' in exponent of numeric literal"),
    (b'01', 'ok 2', "invalid character '1' after top-level value"),
    (b'"\x01"',
     "invalid character '\\x01' in string literal at offset 2",
     "invalid character '\\x01' in string literal"),
    (b'{"a":"\\u12g4"}',
     "invalid character 'g' in \\u hexadecimal character escape at offset 11",
     "invalid character 'g' in \\u hexadecimal character escape"),
    (b'  ', 'ok 0', 'unexpected end of JSON input'),
    (b'[' * 10001,
     "invalid character '[' exceeded max depth at offset 10001",
     "invalid character '[' exceeded max depth"),
    (b"'",
     "invalid character '\\'' looking for beginning of value at offset 1",
     "invalid character '\\'' looking for beginning of value"),
    (b'\\',
     "invalid character '\\\\' looking for beginning of value at offset 1",
     "invalid character '\\\\' looking for beginning of value"),
]


def decoder_says(data: bytes) -> str:
    try:
        return "ok %d" % len(list(values(data)))
    except GoSyntaxError as exc:
        return str(exc)


def unmarshal_says(data: bytes) -> str:
    try:
        check_valid(data)
    except GoSyntaxError as exc:
        return exc.unmarshal_text()
    return "ok"


@pytest.mark.parametrize("data,decoder,unmarshal", CASES, ids=range(len(CASES)))
def test_go_json_errors(data, decoder, unmarshal):
    assert decoder_says(data) == decoder
    assert unmarshal_says(data) == unmarshal


def test_values_are_the_byte_ranges_go_reads():
    data = b' {"a": [1, 2]}  "s" 12 true{}'
    assert [data[a:b] for a, b in values(data)] == [
        b'{"a": [1, 2]}', b'"s"', b'12', b'true', b'{}']


def test_go_duration_prints_as_go_does_everywhere():
    """One time.Duration.String() (issue 21): the copy in streamcfg printed 1234567ns as
    "1.23457ms", and its text is in API errors."""
    from natsjs.admin.render import go_duration as cli
    from natsjs.jetstream.streamcfg import go_duration as api
    from natsjs.monitor import go_duration as monitor
    cases = {0: "0s", 999: "999ns", 1500: "1.5µs", 1234567: "1.234567ms",
             1_000_000_001: "1.000000001s", 120 * 10**9: "2m0s",
             3_723_500_000_000: "1h2m3.5s", -5_000_000: "-5ms"}
    for ns, text in cases.items():
        assert api(ns) == cli(ns) == text
    assert monitor(1.234567e-3) == "1.234567ms"
