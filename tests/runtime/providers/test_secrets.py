"""A key never shows in a repr, an error or a failure; keys come from config or env."""

from __future__ import annotations

import pickle
import traceback
from typing import Any

import pytest

from actors.errors import ModelError
from runtime.providers import (
    AnthropicModel,
    MissingCredentialsError,
    OpenAICompatModel,
    Secret,
    scrub,
)
from runtime.providers.secrets import resolve_api_key

from .support import ANTHROPIC_KEY, KEY, collect, request, run
from .test_failures import VENDORS, Vendor
from .wire_formats import anthropic_frames, anthropic_reply, openai_frames, openai_text_reply
from .wire_server import JsonReply, Reply, Sse, WireServer


def test_a_secret_never_shows_its_value() -> None:
    secret = Secret(KEY)
    for text in (repr(secret), str(secret), f"{secret}", f"{secret!r:>40}", f"{[secret]}"):
        assert KEY not in text
    assert secret.reveal() == KEY
    with pytest.raises(TypeError, match="a Secret is not picklable; pass the key again"):
        pickle.dumps(secret)


def test_a_provider_repr_shows_no_key() -> None:
    openai_model = OpenAICompatModel("m", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    anthropic_model = AnthropicModel("claude-sonnet-4-6", api_key=ANTHROPIC_KEY)
    assert KEY not in repr(openai_model)
    assert "api_key=<set>" in repr(openai_model)
    assert ANTHROPIC_KEY not in repr(anthropic_model)


def test_scrub_masks_given_secrets_and_anything_shaped_like_a_vendor_key() -> None:
    text = f"bad key {KEY}; also sk-proj-ABCDEFGHIJKLMNOP and mine=hunter22"
    assert scrub(text, [Secret("hunter22")]) == "bad key ***; also *** and mine=***"


def _failure_of(vendor: Vendor, wire: WireServer, **options: Any) -> ModelError:
    """The ModelError one request to the scripted ``wire`` fails with."""

    async def body() -> ModelError:
        async with vendor.model(wire.url, **options) as model:
            try:
                await collect(model, request())
            except ModelError as err:
                return err
        raise AssertionError("the request did not fail")

    return run(body)


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_key_echoed_by_the_server_is_scrubbed_from_every_error_text(
    wire: WireServer, vendor: Vendor
) -> None:
    key = KEY if vendor.name == "openai" else ANTHROPIC_KEY
    echoed = key.replace("sk-", "")  # not key-shaped: only the secret itself can mask it
    body = {"type": "error", "error": {"type": "authentication_error"}}
    body["error"]["message"] = f"Incorrect API key provided: {echoed}"
    wire.script(JsonReply(401, body))

    err = _failure_of(vendor, wire, api_key=echoed)
    assert err.failure.code == "AUTH"
    texts = [
        str(err),
        repr(err),
        err.failure.message,
        repr(err.failure),
        "".join(traceback.format_exception(err)),
    ]
    for text in texts:
        assert echoed not in text
    assert "***" in err.failure.message


def test_openai_reads_its_key_from_the_environment(
    wire: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    model = OpenAICompatModel("m")
    assert KEY not in repr(model)
    with pytest.raises(MissingCredentialsError, match=r"\$DEEPSEEK_API_KEY"):
        OpenAICompatModel("deepseek-chat", base_url="https://api.deepseek.com/v1")


def test_a_missing_openai_key_says_where_to_put_one() -> None:
    with pytest.raises(MissingCredentialsError, match=r"\$OPENAI_API_KEY"):
        OpenAICompatModel("gpt-4.1-mini")


def test_a_third_party_endpoint_never_receives_the_openai_key_implicitly(
    wire: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    wire.script(Sse(openai_frames(openai_text_reply("ok"))))

    async def body() -> None:
        async with OpenAICompatModel("m", base_url=wire.url + "/v1") as model:
            await collect(model, request())

    run(body)
    assert wire.requests[0].headers["authorization"] == "Bearer EMPTY"


def test_api_key_env_names_the_variable_to_read(
    wire: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_GATEWAY_KEY", "gw-123456")
    wire.script(Sse(openai_frames(openai_text_reply("ok"))))

    async def body() -> None:
        url = wire.url + "/v1"
        async with OpenAICompatModel("m", base_url=url, api_key_env="MY_GATEWAY_KEY") as model:
            await collect(model, request())

    run(body)
    assert wire.requests[0].headers["authorization"] == "Bearer gw-123456"


def test_anthropic_reads_its_key_from_the_environment(
    wire: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    wire.script(Sse(anthropic_frames(anthropic_reply([{"text": ["ok"]}]))))

    async def body() -> None:
        async with AnthropicModel("claude-sonnet-4-6", base_url=wire.url) as model:
            await collect(model, request())

    run(body)
    headers = wire.requests[0].headers
    assert ANTHROPIC_KEY in headers.get("x-api-key", "") + headers.get("authorization", "")


def test_a_missing_anthropic_key_says_where_to_put_one() -> None:
    with pytest.raises(MissingCredentialsError, match=r"\$ANTHROPIC_API_KEY"):
        AnthropicModel("claude-sonnet-4-6")


def test_an_explicit_key_wins_over_the_environment() -> None:
    env = {"OPENAI_API_KEY": "from-env"}
    secret = resolve_api_key(
        "openai",
        api_key="explicit",
        api_key_env=None,
        env_names=["OPENAI_API_KEY"],
        required=True,
        environ=env,
    )
    assert secret == Secret("explicit")


def _echoing_reply(kind: str, key: str, id_header: str, vendor: Vendor) -> Reply:
    headers = {id_header: f"req_{key}"}
    if kind == "http error":
        body = {"type": "error", "error": {"type": "authentication_error", "message": "no"}}
        return JsonReply(401, body, headers)
    if kind == "dropped stream":
        return Sse(vendor.frames()[:3], then="drop", headers=headers)
    if vendor.name == "openai":  # an empty reply
        return Sse(openai_frames(openai_text_reply()), headers=headers)
    return Sse(anthropic_frames(anthropic_reply([])), headers=headers)


@pytest.mark.parametrize("kind", ["http error", "dropped stream", "empty reply"])
@pytest.mark.parametrize("vendor", VENDORS)
def test_a_key_echoed_in_the_request_id_is_scrubbed_from_the_failure(
    wire: WireServer, vendor: Vendor, kind: str
) -> None:
    key = (KEY if vendor.name == "openai" else ANTHROPIC_KEY).replace("sk-", "")
    wire.script(_echoing_reply(kind, key, vendor.id_header, vendor))

    err = _failure_of(vendor, wire, api_key=key)
    assert err.failure.request_id == "req_***"
    assert key not in repr(err.failure)


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_model_error_keeps_no_sdk_exception_that_holds_the_request_and_its_key(
    wire: WireServer, vendor: Vendor
) -> None:
    body = {"type": "error", "error": {"type": "api_error", "message": "try later"}}
    wire.script(JsonReply(500, body))

    err = _failure_of(vendor, wire)
    assert err.failure.code == "SERVER"
    assert (err.__cause__, err.__context__) == (None, None)
