"""Secrets by name: `{{ secrets.NAME }}` resolves from PAL_SECRET_<NAME> or PAL_SECRETS_FILE when the
template renders, an unknown or malformed name fails with a message naming it (never a value), and
`scrub` replaces every value with [secret:NAME] in whatever is journaled."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pal.core import redact, secrets, templates
from pal.errors import GraphError, TemplateError
from pal.plan.graph import parse_graph

TOKEN = "tok-5f3a9c1e77b2"
OTHER = "pw-0a1b2c3d4e5f"
CONTEXT: dict[str, Any] = {"input": {"x": 1, "keys": {"a": 1}}, "nodes": {}, "run": {"id": "r"}}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith(secrets.ENV_PREFIX) or name == secrets.FILE_VARIABLE:
            monkeypatch.delenv(name)
    yield


def secrets_file(tmp_path: Path, content: Any, name: str = "secrets.json") -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


# -- resolution ---------------------------------------------------------------------------------

def test_a_secret_resolves_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAL_SECRET_API_TOKEN", TOKEN)
    assert secrets.resolve("API_TOKEN") == TOKEN
    assert secrets.resolve("API_TOKEN", env={"PAL_SECRET_API_TOKEN": OTHER}) == OTHER


def test_a_secret_resolves_from_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = secrets_file(tmp_path, {"API_TOKEN": TOKEN, "DB_PASSWORD": OTHER})
    monkeypatch.setenv("PAL_SECRETS_FILE", str(path))
    assert secrets.resolve("DB_PASSWORD") == OTHER
    assert secrets.known_secrets() == {"API_TOKEN": TOKEN, "DB_PASSWORD": OTHER}
    assert secrets.known_secret_values() == frozenset({TOKEN, OTHER})


def test_a_variable_wins_over_the_file(tmp_path: Path) -> None:
    path = secrets_file(tmp_path, {"API_TOKEN": OTHER})
    env = {"PAL_SECRETS_FILE": str(path), "PAL_SECRET_API_TOKEN": TOKEN}
    assert secrets.resolve("API_TOKEN", env=env) == TOKEN


def test_a_rotated_file_is_read_again(tmp_path: Path) -> None:
    path = secrets_file(tmp_path, {"API_TOKEN": TOKEN})
    env = {"PAL_SECRETS_FILE": str(path)}
    assert secrets.resolve("API_TOKEN", env=env) == TOKEN
    secrets_file(tmp_path, {"API_TOKEN": TOKEN + "-rotated"})
    assert secrets.resolve("API_TOKEN", env=env) == TOKEN + "-rotated"


def test_an_unknown_secret_is_named_with_where_to_set_it() -> None:
    with pytest.raises(secrets.SecretError) as info:
        secrets.resolve("MISSING_KEY", env={"PAL_SECRET_OTHER_ONE": TOKEN})
    message = str(info.value)
    assert "unknown secret MISSING_KEY" in message and "PAL_SECRET_MISSING_KEY" in message
    assert "PAL_SECRETS_FILE" in message and TOKEN not in message
    assert isinstance(info.value, TemplateError)  # it fails the step like any template error


@pytest.mark.parametrize("name", ["lower", "1ABC", "A-B", "", "A B", "_A", "Ä", "A.B"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(secrets.SecretError, match="is not a secret name"):
        secrets.resolve(name, env={})


@pytest.mark.parametrize(("content", "fragment"), [
    ("{not json", "is not JSON line 1 column 2"),
    ("[1, 2]", "must hold a JSON object"),
    ({"API_TOKEN": 12345678}, "must be a string, not int"),
    ({"api_token": TOKEN}, "'api_token' is not a secret name"),
    ({"API_TOKEN": "short"}, "shorter than 8 characters"),
])
def test_a_bad_file_is_reported_without_its_values(tmp_path: Path, content: Any, fragment: str) -> None:
    env = {"PAL_SECRETS_FILE": str(secrets_file(tmp_path, content))}
    name = "api_token" if "api_token" in str(content) else "API_TOKEN"
    with pytest.raises(secrets.SecretError) as info:
        secrets.resolve(name.upper() if name != "api_token" else "API_TOKEN", env=env)
    assert fragment in str(info.value)
    assert TOKEN not in str(info.value) and "12345678" not in str(info.value)
    assert secrets.known_secrets(env) == {}  # never raises: a log filter calls it


def test_an_unreadable_file_is_named_and_variables_still_work(tmp_path: Path) -> None:
    env = {"PAL_SECRETS_FILE": str(tmp_path / "absent.json"), "PAL_SECRET_API_TOKEN": TOKEN}
    assert secrets.resolve("API_TOKEN", env=env) == TOKEN
    with pytest.raises(secrets.SecretError, match="cannot be read"):
        secrets.resolve("OTHER_ONE", env=env)
    assert secrets.known_secrets(env) == {"API_TOKEN": TOKEN}


def test_short_and_malformed_variables_are_refused_by_name() -> None:
    with pytest.raises(secrets.SecretError, match="PAL_SECRET_PIN: secret PIN is shorter"):
        secrets.resolve("PIN", env={"PAL_SECRET_PIN": "1234"})
    assert secrets.known_secrets({"PAL_SECRET_PIN": "1234", "PAL_SECRET_lower": TOKEN}) == {}


# -- in templates -------------------------------------------------------------------------------

def test_a_template_renders_a_secret_at_render_time(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = parse_graph({"nodes": [{"id": "t", "type": "trigger"},
                                   {"id": "a", "type": "tool", "data": {"tool": "echo", "args": {
                                       "auth": "Bearer {{ secrets.API_TOKEN }}"}}}],
                         "edges": [{"source": "t", "target": "a"}]})  # valid with the secret unset
    assert TOKEN not in json.dumps(graph.document())
    monkeypatch.setenv("PAL_SECRET_API_TOKEN", TOKEN)
    assert templates.render(graph.nodes["a"].data["args"], CONTEXT) == {"auth": f"Bearer {TOKEN}"}
    assert templates.render_string("{{ secrets.API_TOKEN }}", CONTEXT) == TOKEN
    assert templates.render_string("{{ secrets['API_TOKEN'] | length }}", CONTEXT) == len(TOKEN)
    monkeypatch.setenv("PAL_SECRET_API_TOKEN", OTHER)  # the next render sees a new value
    assert templates.render_string("{{ secrets.API_TOKEN }}", CONTEXT) == OTHER


def test_an_unknown_secret_fails_the_render_naming_it() -> None:
    with pytest.raises(TemplateError, match="unknown secret NOT_SET"):
        templates.render_string("x {{ secrets.NOT_SET }}", CONTEXT)


def test_a_template_only_sees_the_secrets_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAL_SECRET_API_TOKEN", TOKEN)
    monkeypatch.setenv("PAL_SECRET_DB_PASSWORD", OTHER)
    context = {**CONTEXT, "secrets": {"DB_PASSWORD": "from-the-caller"}}
    assert templates.render_string("{{ secrets.API_TOKEN }}", context) == TOKEN
    with pytest.raises(TemplateError):  # DB_PASSWORD is not named here, so it is not there
        templates.render_string("{{ secrets.API_TOKEN ~ secrets.get('DB_PASSWORD') }}", context)


@pytest.mark.parametrize(("text", "fragment"), [
    ("{{ secrets.key }}", "unknown name(s) secrets.key"),
    ("{{ secrets['lower'] }}", "unknown name(s) secrets.lower"),
    ("{{ secrets }}", "other than as secrets.NAME"),
    ("{{ secrets | list }}", "other than as secrets.NAME"),
    ("{{ secrets[input.name] }}", "other than as secrets.NAME"),
    ("{{ secrets.items() }}", "unknown name(s) secrets.items"),
    ("{% set secrets = 1 %}", "other than as secrets.NAME"),
    ("{% for secrets in input.xs %}{% endfor %}", "other than as secrets.NAME"),
    ("{{ input.x | default(secrets) }}", "other than as secrets.NAME"),
])
def test_secrets_can_only_be_named(text: str, fragment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAL_SECRET_API_TOKEN", TOKEN)
    message = templates.check(text)
    assert message is not None and fragment in message
    with pytest.raises(TemplateError, match="refused by the sandbox"):
        templates.render_string(text, CONTEXT)


def test_a_graph_naming_a_bad_secret_is_invalid() -> None:
    with pytest.raises(GraphError, match=r"data.args.x: template uses unknown name\(s\) secrets.key"):
        parse_graph({"nodes": [{"id": "t", "type": "trigger"},
                               {"id": "a", "type": "tool", "data": {"tool": "echo",
                                                                     "args": {"x": "{{ secrets.key }}"}}}],
                     "edges": [{"source": "t", "target": "a"}]})


def test_an_error_message_never_holds_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAL_SECRET_API_TOKEN", TOKEN)
    for text in ("{{ input.keys[secrets.API_TOKEN] }}", "{{ input.keys[secrets.API_TOKEN].x }}",
                 "{{ secrets.API_TOKEN + 1 }}", "{{ [secrets.API_TOKEN].index('x') }}",
                 "{{ input.x[secrets.API_TOKEN] }}"):
        with pytest.raises(TemplateError) as info:
            templates.render_string(text, CONTEXT)
        assert TOKEN not in str(info.value), text
        assert info.value.__cause__ is None and info.value.__suppress_context__
    with pytest.raises(TemplateError, match=r"\[secret:API_TOKEN\]"):
        templates.render_string("{{ input.keys[secrets.API_TOKEN] }}", CONTEXT)


# -- scrub --------------------------------------------------------------------------------------

SECRETS = {"API_TOKEN": TOKEN, "DB_PASSWORD": OTHER}


def test_scrub_replaces_values_everywhere_in_a_json_value() -> None:
    value = {"echo": f"Bearer {TOKEN}", TOKEN: [OTHER, 1, None, True, {"deep": f"{OTHER}/{TOKEN}"}],
             "n": 3.5}
    assert secrets.scrub(value, SECRETS) == {
        "echo": "Bearer [secret:API_TOKEN]",
        "[secret:API_TOKEN]": ["[secret:DB_PASSWORD]", 1, None, True,
                               {"deep": "[secret:DB_PASSWORD]/[secret:API_TOKEN]"}],
        "n": 3.5}
    assert value["echo"] == f"Bearer {TOKEN}"  # pure: the input is untouched


def test_scrub_is_an_identity_without_secrets_or_matches() -> None:
    value = {"a": [1, "b"]}
    assert secrets.scrub(value, {}) is value
    assert secrets.scrub(value, SECRETS) == value
    assert secrets.scrub("plain", SECRETS) == "plain"
    assert secrets.scrub((1, "x"), SECRETS) == [1, "x"]  # tuples come back as lists


def test_scrub_replaces_the_longer_of_overlapping_values_whole() -> None:
    nested = {"SHORT_ONE": "abcdefgh", "LONG_ONE": "abcdefgh-and-more"}
    assert secrets.scrub("x abcdefgh-and-more y abcdefgh", nested) == \
        "x [secret:LONG_ONE] y [secret:SHORT_ONE]"


def test_scrub_catches_a_secret_printed_as_a_number() -> None:
    assert secrets.scrub([12345678901, 5], {"PIN_CODE": "12345678901"}) == ["[secret:PIN_CODE]", 5]


def test_scrub_handles_depth_sharing_and_cycles() -> None:
    deep: Any = TOKEN
    for _ in range(5000):
        deep = [deep]
    scrubbed = secrets.scrub(deep, SECRETS)
    for _ in range(5000):
        scrubbed = scrubbed[0]
    assert scrubbed == "[secret:API_TOKEN]"
    shared = [TOKEN]
    result = secrets.scrub({"a": shared, "b": shared}, SECRETS)
    assert result == {"a": ["[secret:API_TOKEN]"], "b": ["[secret:API_TOKEN]"]}
    cyclic: list[Any] = [TOKEN]
    cyclic.append(cyclic)
    looped = secrets.scrub(cyclic, SECRETS)
    assert looped[0] == "[secret:API_TOKEN]" and looped[1] is looped


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    else:
        yield str(value)


@settings(max_examples=200, deadline=None)
@given(value=json_values, secret=st.text(alphabet="abcdefghXYZ0123-_!", min_size=8, max_size=20),
       data=st.data())
def test_no_secret_survives_scrub(value: Any, secret: str, data: st.DataObject) -> None:
    """Wherever a value is planted (a string, a key, around other text), scrub leaves none of it."""
    planted = data.draw(st.sampled_from([
        {"out": value, "echo": f"x{secret}y"}, {secret: value}, [value, secret, secret + secret]]))
    scrubbed = secrets.scrub(planted, {"THE_SECRET": secret})
    assert all(secret not in text for text in _strings(scrubbed))
    assert "[secret:THE_SECRET]" in json.dumps(scrubbed)


def test_scrub_known_uses_what_this_process_can_render(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAL_SECRET_API_TOKEN", TOKEN)
    assert secrets.scrub_known({"x": TOKEN}) == {"x": "[secret:API_TOKEN]"}


def test_redaction_knows_the_graph_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """pal.core.secrets registers itself with pal.core.redact, which scrubs journal writes and log lines."""
    monkeypatch.setenv("PAL_SECRET_API_TOKEN", TOKEN)
    assert redact.redact_text(f"failed with {TOKEN}") == "failed with [secret:API_TOKEN]"


# -- a subagent's child input --------------------------------------------------------------------


def test_a_child_input_names_the_secrets_its_parent_handed_on_and_reveals_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAL_SECRET_HOOK_TOKEN", TOKEN)
    handed = {"token": TOKEN, "header": f"Bearer {TOKEN}", TOKEN: [1, "plain"]}
    stored = secrets.hand_on(handed)
    assert stored == {"token": "[secret:HOOK_TOKEN]", "header": "Bearer [secret:HOOK_TOKEN]",
                      "[secret:HOOK_TOKEN]": [1, "plain"]}
    assert secrets.holds_placeholder(stored) and not secrets.holds_placeholder({"a": "[secret:x]"})
    assert secrets.reveal(stored) == handed


def test_placeholder_text_already_in_a_child_input_is_never_revealed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A run's input, or an earlier step's scrubbed output, may hold placeholder text: handed on as it
    # is, it would make the child resolve a secret that no template of the graph handed on.
    monkeypatch.setenv("PAL_SECRET_HOOK_TOKEN", TOKEN)
    monkeypatch.setenv("PAL_SECRET_DB_PASSWORD", OTHER)
    stored = secrets.hand_on({"note": "send [secret:DB_PASSWORD] please", "token": TOKEN})
    assert stored == {"note": f"send {redact.REDACTED} please", "token": "[secret:HOOK_TOKEN]"}
    assert OTHER not in json.dumps(secrets.reveal(stored))


def test_revealing_a_secret_this_worker_lacks_fails_naming_it() -> None:
    with pytest.raises(secrets.SecretError, match="unknown secret GONE"):
        secrets.reveal({"token": "[secret:GONE]"})
