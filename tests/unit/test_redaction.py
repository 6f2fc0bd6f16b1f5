"""pal.core.redact: every credential shape PAL promises to remove is removed, in many generated variants,
and ordinary text is left alone. The sinks are tested in tests/e2e/test_secret_sinks.py."""

from __future__ import annotations

import logging

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pal.core import redact as redact_module
from pal.core.redact import (
    REDACTED,
    _RedactingRecords,
    add_secret_source,
    install_log_redaction,
    redact,
    redact_text,
)

# Credentials that look like credentials: long enough, no separators a URL or header would split on.
CREDENTIAL = st.text(st.sampled_from("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789"),
                     min_size=12, max_size=40)
HOST = st.sampled_from(["api.example.com", "127.0.0.1", "hooks.internal:8443", "[::1]:80"])
SCHEME = st.sampled_from(["http", "https", "HTTPS", "smtp", "postgresql", "redis"])
PARAM = st.sampled_from(["token", "key", "sig", "X-Amz-Signature", "code", "q", "apikey"])
AROUND = st.sampled_from(["{}", "POST {} failed", "webhook {}: HTTP 400", "'{}'", "url={}&x", "({})"])


@settings(max_examples=200)
@given(SCHEME, st.sampled_from(["{c}", "user:{c}", "{c}:x"]), HOST, CREDENTIAL, AROUND)
def test_user_info_in_any_url_is_removed(scheme: str, info: str, host: str, credential: str,
                                         around: str) -> None:
    text = around.format(f"{scheme}://{info.format(c=credential)}@{host}/path")
    out = redact_text(text)
    assert credential not in out
    assert host.split(":")[0].strip("[]") in out  # where it went is still readable


@settings(max_examples=200)
@given(SCHEME, HOST, PARAM, CREDENTIAL, st.booleans(), AROUND)
def test_every_query_value_is_removed(scheme: str, host: str, param: str, credential: str,
                                      fragment: bool, around: str) -> None:
    url = f"{scheme}://{host}/p?a=1&{param}={credential}" + ("#top" if fragment else "")
    out = redact_text(around.format(url))
    assert credential not in out
    assert f"{param}={REDACTED}" in out


@settings(max_examples=200)
@given(st.sampled_from(["Bearer", "bearer", "Basic", "Token"]), CREDENTIAL,
       st.sampled_from(["Authorization: {}", "{}", "headers={{'Authorization': '{}'}}", "got {} back"]))
def test_authorization_credentials_are_removed(scheme: str, credential: str, around: str) -> None:
    assume(credential not in around)  # "Authorizatio" is a fine credential, and stays in the header's name
    assert credential not in redact_text(around.format(f"{scheme} {credential}"))


@settings(max_examples=200)
@given(st.sampled_from(["api_key", "API-KEY", "apikey", "password", "client_secret", "access_token",
                        "x-api-key", "Authorization", "session"]),
       st.sampled_from(["=", ": ", "\": \"", "='"]), CREDENTIAL)
def test_credential_named_pairs_are_removed(name: str, separator: str, credential: str) -> None:
    # The key's name stays, so it is left out of the search: a generated credential can be a piece of
    # it ("Authorizatio"), which hypothesis found.
    assert credential not in redact_text(f"error: {name}{separator}{credential} rest").replace(name, "")


@given(st.sampled_from(["sk-", "sk-proj-", "sk-ant-"]), CREDENTIAL)
def test_provider_key_shapes_are_removed(prefix: str, credential: str) -> None:
    assert credential not in redact_text(f"Incorrect API key provided: {prefix}{credential}.")


def test_known_secret_values_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "operator-key-0000")
    monkeypatch.setattr(redact_module, "_secret_sources", [])
    add_secret_source(lambda: {"CRM_TOKEN": "plain words are a secret too"})
    out = redact_text("echo: operator-key-0000 and plain words are a secret too!")
    assert out == "echo: [secret:OPENAI_API_KEY] and [secret:CRM_TOKEN]!"


def test_mappings_lose_credential_named_values_and_keep_the_rest() -> None:
    value = {"headers": {"Authorization": "anything at all", "Accept": "json"},
             "items": ["see https://u:p@h/x", 3, None], "password": "", "n": 1}
    assert redact(value) == {"headers": {"Authorization": REDACTED, "Accept": "json"},
                             "items": [f"see https://{REDACTED}@h/x", 3, None], "password": "", "n": 1}


@pytest.mark.parametrize("text", ["step s1 failed: HTTP 404", "nothing to see at https://example.com/a/b",
                                  "ratio 3/4", "attempt 2 of 3", "a?b=c is not a URL"])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact_text(text) == text


def test_log_records_are_redacted_when_made(caplog: pytest.LogCaptureFixture) -> None:
    install_log_redaction(whole_process=True)  # a process PAL runs
    install_log_redaction(whole_process=True)  # idempotent
    with caplog.at_level(logging.INFO):
        logging.getLogger("pal.test").info("calling %s", "https://u:hunter2hunter2@h/x?token=abcdefabcdef")
        logging.getLogger("somelib").warning("auth failed: Bearer abcdefabcdefabcdef")
        try:
            raise RuntimeError("password=hunter2hunter2")
        except RuntimeError:
            logging.getLogger("celery.app.trace").exception("task failed")
    text = caplog.text
    assert "hunter2hunter2" not in text and "abcdefabcdef" not in text
    assert REDACTED in text


def test_a_record_without_credentials_keeps_its_arguments_and_one_with_keeps_their_shape() -> None:
    install_log_redaction(whole_process=True)
    access = logging.getLogger("uvicorn.access").makeRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", "/v1/runs?limit=5", "1.1", 200), None)
    assert access.args == ("127.0.0.1:5000", "GET", "/v1/runs?limit=5", "1.1", 200)  # as made
    secret = logging.getLogger("uvicorn.access").makeRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", "/hook?token=abcdefabcdefabcdef", "1.1", 200), None)
    assert isinstance(secret.args, tuple) and len(secret.args) == 5  # a handler may still unpack them
    assert "abcdefabcdefabcdef" not in secret.getMessage() and REDACTED in secret.getMessage()
    own = logging.getLogger("myapp").makeRecord("myapp", logging.INFO, __file__, 1, "user %s has %d items",
                                                ("ann", 3), None)
    assert own.args == ("ann", 3)


def test_a_credential_formed_only_by_the_arguments_together_is_still_redacted() -> None:
    install_log_redaction(whole_process=True)
    record = logging.getLogger("somelib").makeRecord(
        "somelib", logging.INFO, __file__, 1, "header %s%s", ("Bearer ", "abcdefabcdefabcdef"), None)
    assert "abcdefabcdefabcdef" not in record.getMessage() and REDACTED in record.getMessage()


def test_in_someone_elses_process_only_pals_own_records_are_redacted() -> None:
    records = _RedactingRecords(logging.LogRecord)  # what a pal.Client or pal.install installs
    theirs = records("myapp.http", logging.INFO, __file__, 1, "GET %s", ("https://u:hunter2hunter2@h/x",), None)
    assert theirs.args == ("https://u:hunter2hunter2@h/x",)  # the app's record, as the app made it
    ours = records("pal.engine.steps", logging.INFO, __file__, 1, "GET %s", ("https://u:hunter2hunter2@h/x",),
                   None)
    assert "hunter2hunter2" not in ours.getMessage() and REDACTED in ours.getMessage()
    assert records("pal", logging.INFO, __file__, 1, "token=%s", ("abcdefabcdefabcdef",), None).args != (
        "abcdefabcdefabcdef",)
