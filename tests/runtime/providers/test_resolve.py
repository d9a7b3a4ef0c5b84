"""Model strings resolve to providers; unknown ones fail with a helpful error."""

from __future__ import annotations

import sys

import pytest

from actors.model import Model
from runtime.providers import (
    KNOWN_SCHEMES,
    AnthropicModel,
    OpenAICompatModel,
    UnknownModelError,
    resolve_model,
)

from .support import ANTHROPIC_KEY, KEY


def test_openai_strings_resolve_to_the_openai_compatible_provider() -> None:
    model = resolve_model("openai:gpt-4.1-mini", api_key=KEY)
    assert isinstance(model, OpenAICompatModel)
    assert (model.provider, model.name, model.base_url) == ("openai", "gpt-4.1-mini", None)


def test_an_openai_compatible_string_carries_its_base_url() -> None:
    model = resolve_model("openai-compatible:deepseek-chat@https://host.example/v1")
    assert isinstance(model, OpenAICompatModel)
    assert model.provider == "openai-compatible"
    assert (model.name, model.base_url) == ("deepseek-chat", "https://host.example/v1")


def test_a_model_name_may_contain_an_at_sign() -> None:
    model = resolve_model("openai-compatible:org/model@v2@http://127.0.0.1:8000/v1")
    assert (model.name, model.base_url) == ("org/model@v2", "http://127.0.0.1:8000/v1")  # type: ignore[attr-defined]


def test_deepseek_and_ollama_have_default_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", KEY)
    deepseek = resolve_model("deepseek:deepseek-chat")
    ollama = resolve_model("ollama:llama3.2")
    assert deepseek.base_url == "https://api.deepseek.com/v1"  # type: ignore[attr-defined]
    assert ollama.base_url == "http://localhost:11434/v1"  # type: ignore[attr-defined]
    assert (deepseek.provider, ollama.provider) == ("deepseek", "ollama")


def test_anthropic_strings_resolve_to_the_messages_provider() -> None:
    model = resolve_model("anthropic:claude-sonnet-4-6", api_key=ANTHROPIC_KEY, max_tokens=99)
    assert isinstance(model, AnthropicModel)
    assert (model.provider, model.name) == ("anthropic", "claude-sonnet-4-6")


def test_options_reach_the_provider() -> None:
    model = resolve_model("openai:gpt-4.1-mini", api_key=KEY, max_concurrency=7)
    assert model.statistics().max_concurrency == 7  # type: ignore[attr-defined]


def test_a_model_instance_is_returned_as_it_is() -> None:
    model = OpenAICompatModel("m", base_url="http://127.0.0.1:9/v1")
    assert resolve_model(model) is model


@pytest.mark.parametrize(
    "spec", ["gpt-4", "nosuch:model", "openai:", "openai-compatible:model-without-url"]
)
def test_an_unknown_or_malformed_string_is_an_unknown_model_error(spec: str) -> None:
    with pytest.raises(UnknownModelError) as caught:
        resolve_model(spec, api_key=KEY)
    assert isinstance(caught.value, ValueError)
    message = str(caught.value)
    assert spec in message
    for scheme in KNOWN_SCHEMES:
        assert f"{scheme}:" in message


def test_a_missing_http_client_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "aiohttp", None)  # makes `import aiohttp` fail
    with pytest.raises(ImportError, match=r"pip install 'corral\[openai\]'"):
        resolve_model("openai:gpt-4.1-mini", api_key=KEY)
    with pytest.raises(ImportError, match=r"pip install 'corral\[anthropic\]'"):
        resolve_model("anthropic:claude-sonnet-4-6", api_key=ANTHROPIC_KEY)


def test_scripted_echo_resolves_to_the_scripted_model() -> None:
    model = resolve_model("scripted:echo")
    assert isinstance(model, Model)
    assert type(model).__name__ == "ScriptedModel"
