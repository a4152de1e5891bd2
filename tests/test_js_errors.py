"""natsjs/jetstream/errors.py: nats-server's JetStream API error table and ApiError.

The expected rows below were copied by hand from nats-server's server/errors.json, so a
typo or a shifted row in the table fails here.
"""
import collections
import re

import pytest

from natsjs.jetstream.errors import BY_CONSTANT, BY_ERR_CODE, ERRORS, ApiError, placeholders

# constant: (code, err_code, description) as in server/errors.json
SAMPLE = {
    "JSStreamNotFoundErr": (404, 10059, "stream not found"),
    "JSStreamNameExistErr": (400, 10058,
                             "stream name already in use with a different configuration"),
    "JSInvalidJSONErr": (400, 10025, "invalid JSON: {err}"),
    "JSConsumerNotFoundErr": (404, 10014, "consumer not found"),
    "JSStreamSubjectOverlapErr": (400, 10065, "subjects overlap with an existing stream"),
    "JSStreamWrongLastSequenceErrF": (400, 10071, "wrong last sequence: {seq}"),
    "JSStreamReplicasNotSupportedErr": (500, 10074,
                                        "replicas > 1 not supported in non-clustered mode"),
    "JSNoMessageFoundErr": (404, 10037, "no message found"),
    "JSStreamMismatchErr": (400, 10056, "stream name in subject does not match request"),
    "JSConsumerNameExistErr": (400, 10013, "consumer name already in use"),
    "JSNotEnabledErr": (503, 10076, "JetStream not enabled"),
    "JSStreamExternalDelPrefixOverlapsErrF": (
        400, 10022,
        "stream external delivery prefix {prefix} overlaps with stream subject {subject}"),
    "JSClusterNotAvailErr": (503, 10008, "JetStream system temporarily unavailable"),
    "JSStreamInvalidConfigF": (500, 10052, "{err}"),
    "JSStreamWrongLastMsgIDErrF": (400, 10070, "wrong last msg ID: {id}"),
    "JSConsumerMaxRequestBatchExceededF": (
        400, 10125, "consumer max request batch exceeds server limit of {limit}"),
    "JSBadRequestErr": (400, 10003, "bad request"),
    "JSStreamDuplicateMessageConflict": (409, 10158, "duplicate message id is in process"),
    "JSConsumerAlreadyExists": (400, 10148, "consumer already exists"),
    "JSStreamNameContainsPathSeparatorsErr": (400, 10128,
                                              "Stream name can not contain path separators"),
}


@pytest.mark.parametrize("constant", sorted(SAMPLE))
def test_sample_rows_match_errors_json(constant):
    assert BY_CONSTANT[constant][1:] == SAMPLE[constant]


def test_table_size_and_uniqueness():
    assert len(ERRORS) == 226          # rows in errors.json of the reference's source
    names = collections.Counter(row[0] for row in ERRORS)
    assert [n for n, k in names.items() if k > 1] == []
    codes = collections.Counter(row[2] for row in ERRORS)
    assert [c for c, k in codes.items() if k > 1] == []
    assert len(BY_CONSTANT) == len(BY_ERR_CODE) == len(ERRORS)


def test_rows_are_well_formed():
    for constant, code, err_code, description in ERRORS:
        assert re.fullmatch(r"JS\w+", constant), constant
        assert code in (400, 404, 409, 412, 429, 500, 503), constant
        assert 10000 < err_code < 11000, constant
        assert description and description == description.strip(), constant
    assert [row[2] for row in ERRORS] == sorted(row[2] for row in ERRORS)


def test_plain_error():
    e = ApiError.of("JSStreamNotFoundErr")
    assert (e.code, e.err_code, e.description) == (404, 10059, "stream not found")
    assert e.to_dict() == {"code": 404, "err_code": 10059, "description": "stream not found"}
    assert ApiError.of("JSStreamNameExistErr").to_dict() == {
        "code": 400, "err_code": 10058,
        "description": "stream name already in use with a different configuration"}
    assert str(e) == "stream not found (10059)"      # Go's ApiError.Error()
    assert e == ApiError(404, 10059, "stream not found")
    assert e.is_("JSStreamNotFoundErr") and not e.is_("JSConsumerNotFoundErr")
    with pytest.raises(ApiError):
        raise e


def test_substitution():
    e = ApiError.of("JSInvalidJSONErr", err="unexpected end of JSON input")
    assert e.to_dict() == {"code": 400, "err_code": 10025,
                           "description": "invalid JSON: unexpected end of JSON input"}
    # numbers and booleans print as Go's %v does
    assert ApiError.of("JSStreamWrongLastSequenceErrF", seq=7).description == \
        "wrong last sequence: 7"
    assert ApiError.of("JSStreamInvalidConfigF", err=True).description == "true"
    # an exception passed as err reads as its message; an ApiError as Go's Error()
    assert ApiError.of("JSStreamCreateErrF", err=ValueError("disk full")).description == \
        "disk full"
    inner = ApiError.of("JSStreamNotFoundErr")
    assert ApiError.of("JSStreamCreateErrF", err=inner).description == "stream not found (10059)"
    # two placeholders; a value is not scanned again for placeholders
    e = ApiError.of("JSStreamExternalDelPrefixOverlapsErrF", prefix="x.{subject}", subject="x.>")
    assert e.description == ("stream external delivery prefix x.{subject} overlaps with "
                             "stream subject x.>")


def test_unless_keeps_an_api_error():
    inner = ApiError.of("JSStreamSubjectOverlapErr")
    assert ApiError.of("JSStreamCreateErrF", err=inner, unless=inner) is inner
    plain = OSError("no space")
    e = ApiError.of("JSStreamCreateErrF", err=plain, unless=plain)
    assert (e.err_code, e.description) == (10049, "no space")


def test_placeholders_must_match():
    assert placeholders("JSStreamExternalDelPrefixOverlapsErrF") == ("prefix", "subject")
    assert placeholders("JSStreamNotFoundErr") == ()
    with pytest.raises(TypeError):
        ApiError.of("JSInvalidJSONErr")
    with pytest.raises(TypeError):
        ApiError.of("JSStreamNotFoundErr", err="x")
    with pytest.raises(KeyError):
        ApiError.of("JSNoSuchErr")
