"""Subject transforms (natsjs/subject_transform.py): the mapping language on its own, and
a stream's ``subject_transform`` and republish end to end on both servers."""
from __future__ import annotations

import json

import nats
import pytest

from natsjs.subject_transform import SubjectTransform, TransformError, validate_mapping
from test_jetstream import TIMEOUT, connect, js_server, run  # noqa: F401  (fixture)


@pytest.mark.parametrize("src,dest,subject,out", [
    ("foo.*.*", "bar.$2.{{wildcard(1)}}", "foo.a.b", "bar.b.a"),
    ("foo.>", "bar.>", "foo.a.b.c", "bar.a.b.c"),
    ("foo.*.>", "x.$1.>", "foo.a.b.c", "x.a.b.c"),
    ("a.*", "{{splitfromleft(1,2)}}", "a.abcdef", "ab.cdef"),
    ("a.*", "{{SplitFromRight(1,2)}}", "a.abcdef", "abcd.ef"),
    ("a.*", "{{slicefromleft(1,4)}}", "a.abcdefghij", "abcd.efgh.ij"),
    ("a.*", "{{slicefromright(1,4)}}", "a.abcdefghij", "ab.cdef.ghij"),
    ("a.*", "{{split(1,-)}}", "a.-x--y-", "x.y"),
    ("a.*", "{{splitfromleft(1,9)}}", "a.short", "short"),
    ("a.*", "p.{{partition(10,1)}}", "a.key", "p.8"),
    ("orders", "p.{{partition(4)}}", "orders", "p.0"),
    (">", ">", "any.thing", "any.thing"),
])
def test_transform_functions(src, dest, subject, out):
    assert SubjectTransform(src, dest).match(subject) == out


def test_transform_does_not_map_what_the_source_does_not_match():
    tr = SubjectTransform("foo.*", "bar.$1")
    with pytest.raises(TransformError):
        tr.match("baz.x")
    assert tr.apply("baz.x") == "baz.x"


@pytest.mark.parametrize("src,dest,err", [
    ("foo.*", "foo.$3", "invalid mapping destination: wildcard index out of range in "
                        "$3: [3]"),
    ("foo.*", "{{nope(1)}}", "invalid mapping destination: unknown function in {{nope(1)}}"),
    ("foo.*", "{{wildcard()}}", "invalid mapping destination: not enough arguments passed "
                                "to the function in {{wildcard()}}"),
    ("foo.*", "x.>", "invalid subject"),
    ("foo", "x.$1", "invalid mapping destination: wildcard index out of range in $1"),
    ("foo.*", "a..b", "invalid mapping destination: invalid transform"),
])
def test_validate_mapping_errors(src, dest, err):
    with pytest.raises(TransformError) as e:
        validate_mapping(src, dest)
    assert str(e.value) == err


DEST = ("ord.{{partition(5,1,2)}}.{{wildcard(2)}}.$1.{{splitfromleft(1,1)}}"
        ".{{slicefromright(2,2)}}.{{split(2,x)}}")


def test_stream_subject_transform_on_ingest(js_server):
    """The transform rewrites the subject before the message is stored; the mapped
    subjects are the reference's (partition hashes included)."""
    async def main():
        nc, js = await connect(js_server)
        cfg = {"name": "T", "subjects": ["orders.*.*"],
               "subject_transform": {"src": "orders.*.*", "dest": DEST},
               "republish": {"src": "ord.>", "dest": "out.>"}}
        r = json.loads((await nc.request("$JS.API.STREAM.CREATE.T", json.dumps(cfg).encode(),
                                         timeout=TIMEOUT)).data)
        assert r["config"]["subject_transform"] == {"src": "orders.*.*", "dest": DEST}
        rp = await nc.subscribe("out.>")
        for a, b in [("alpha", "12345"), ("b", "x1x2x"), ("ccc", "9"), ("dd", "abcd")]:
            await js.publish("orders.%s.%s" % (a, b), b"x")
        got = [(await js.get_msg("T", seq)).subject for seq in range(1, 5)]
        assert got == ["ord.0.12345.alpha.a.lpha.1.23.45.12345",
                       "ord.4.x1x2x.b.b.x.1x.2x.1.2",
                       "ord.2.9.ccc.c.cc.9.9",
                       "ord.3.abcd.dd.d.d.ab.cd.abcd"]
        # Republish sees the transformed subject.
        m = await rp.next_msg(TIMEOUT)
        assert m.subject == "out.0.12345.alpha.a.lpha.1.23.45.12345"
        assert m.headers["Nats-Subject"] == got[0]
        # A bad destination is refused with the reference's error.
        cfg = {"name": "B", "subjects": ["b.*"], "subject_transform": {"src": "b.*",
                                                                       "dest": "c.$2"}}
        r = json.loads((await nc.request("$JS.API.STREAM.CREATE.B", json.dumps(cfg).encode(),
                                         timeout=TIMEOUT)).data)
        assert r["error"]["err_code"] == 10156
        assert r["error"]["description"] == ("stream transform: invalid mapping destination: "
                                             "wildcard index out of range in $2: [2]")
        await nc.close()
    run(main())
