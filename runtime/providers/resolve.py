"""Model strings: ``"scheme:model[@base_url]"`` to a :class:`~actors.model.Model`.

=========================================  ===========================================
``openai:gpt-4.1-mini``                    OpenAI (``$OPENAI_API_KEY``)
``openai-compatible:NAME@https://host/v1`` any OpenAI-compatible endpoint
``deepseek:deepseek-chat``                 DeepSeek (``$DEEPSEEK_API_KEY``)
``ollama:llama3.2[@http://host:11434/v1]`` a local Ollama server (no key)
``anthropic:claude-sonnet-4-6``            Anthropic (``$ANTHROPIC_API_KEY``)
``scripted:echo``                          ``runtime.ScriptedModel.echo()`` (tests, load)
``process:openai:gpt-4.1-mini``            any of these in a process of its own
=========================================  ===========================================

``openai:``, ``deepseek:`` and ``anthropic:`` accept ``@base_url`` too. Keyword options
go to the provider's constructor (``max_concurrency=``, ``timeout=``, ``api_key_env=``).
``process:`` makes a :class:`~.process.ProcessModel` of the string after it, one per
string and options in this process (every agent spawned with it shares its child); its
limiter runs in the child, on the child's clock, not on a runtime's scheduler.
"""

from __future__ import annotations

import importlib
import pickle
import threading
from collections.abc import Callable
from typing import Any, Final

from actors import Model, Scheduler

from ..errors import UnknownModelError
from .anthropic_messages import AnthropicModel
from .limits import ProviderLimiter
from .openai_compat import OpenAICompatModel
from .process import ProcessModel

__all__ = ["KNOWN_SCHEMES", "UnknownModelError", "resolve_model"]

DEEPSEEK_URL: Final = "https://api.deepseek.com/v1"
OLLAMA_URL: Final = "http://localhost:11434/v1"


def _split(spec: str, rest: str) -> tuple[str, str | None]:
    """``name@http(s)://url`` to ``(name, url)``; a name may itself contain ``@``."""
    for marker in ("@https://", "@http://"):
        at = rest.find(marker)
        if at >= 0:
            return rest[:at], rest[at + 1 :]
    return rest, None


def _openai(provider: str, default_url: str | None, *, needs_url: bool = False) -> _Factory:
    def make(spec: str, name: str, url: str | None, options: dict[str, Any]) -> Model:
        base_url = url or default_url
        if needs_url and base_url is None:
            raise UnknownModelError(
                spec, KNOWN_SCHEMES, "an openai-compatible model needs '@<base_url>'"
            )
        options.setdefault("provider", provider)
        return OpenAICompatModel(name, base_url=base_url, **options)

    return make


def _anthropic(spec: str, name: str, url: str | None, options: dict[str, Any]) -> Model:
    return AnthropicModel(name, base_url=url, **options)


def _scripted(spec: str, name: str, url: str | None, options: dict[str, Any]) -> Model:
    try:
        module = importlib.import_module("runtime.scripted")
    except ImportError as err:
        raise UnknownModelError(
            spec, KNOWN_SCHEMES, "runtime.ScriptedModel is not available"
        ) from err
    scripted = module.ScriptedModel
    maker = getattr(scripted, name, None)
    if name.startswith("_") or not callable(maker):
        raise UnknownModelError(spec, KNOWN_SCHEMES, f"ScriptedModel has no factory {name!r}")
    model = maker(**options)
    if not isinstance(model, Model):
        raise UnknownModelError(
            spec, KNOWN_SCHEMES, f"ScriptedModel.{name}() did not return a Model"
        )
    return model


_Factory = Callable[[str, str, "str | None", dict[str, Any]], Model]

_SCHEMES: Final[dict[str, _Factory]] = {
    "openai": _openai("openai", None),
    "openai-compatible": _openai("openai-compatible", None, needs_url=True),
    "deepseek": _openai("deepseek", DEEPSEEK_URL),
    "ollama": _openai("ollama", OLLAMA_URL),
    "anthropic": _anthropic,
    "scripted": _scripted,
}
KNOWN_SCHEMES: Final = (*_SCHEMES, "process")

_PROCESS_MODELS: dict[bytes, Model] = {}  # one ProcessModel a string and options
_PROCESS_LOCK = threading.Lock()


def _in_a_process(spec: str, inner: str, options: dict[str, Any]) -> Model:
    """``process:INNER``: the one ProcessModel of ``INNER`` and ``options``."""
    if not inner:
        raise UnknownModelError(
            spec,
            KNOWN_SCHEMES,
            "'process:' needs a model string after it, e.g. process:openai:gpt-4.1-mini",
        )
    if inner.partition(":")[0].strip().lower() == "process":
        raise UnknownModelError(spec, KNOWN_SCHEMES, "a process model cannot run another one")
    try:
        key = pickle.dumps((inner, sorted(options.items())))
    except Exception:  # noqa: BLE001 - what cannot pickle: ProcessModel says why, below
        return ProcessModel(resolve_model, inner, **options)
    with _PROCESS_LOCK:
        model = _PROCESS_MODELS.get(key)
        if model is None:
            model = _PROCESS_MODELS[key] = ProcessModel(resolve_model, inner, **options)
    return model


def resolve_model(
    spec: str | Model, *, scheduler: Scheduler | None = None, **options: Any
) -> Model:
    """The model ``spec`` names (a :class:`Model` is returned as it is). With
    ``scheduler`` (a runtime's), a vendor model's limiter waits on its clock.

    Raises :class:`UnknownModelError` for an unknown scheme or a malformed string, and
    ``ImportError`` (saying which ``pip install 'corral[...]'``) for a missing HTTP client.
    """
    if not isinstance(spec, str):
        if options:
            raise TypeError("options apply to model strings, not to a Model instance")
        return spec
    scheme, sep, rest = spec.partition(":")
    if not sep:
        raise UnknownModelError(spec, KNOWN_SCHEMES, "expected 'scheme:model'")
    if scheme.strip().lower() == "process":
        return _in_a_process(spec, rest.strip(), options)
    factory = _SCHEMES.get(scheme.strip().lower())
    if factory is None:
        raise UnknownModelError(spec, KNOWN_SCHEMES, f"unknown scheme {scheme!r}")
    name, url = _split(spec, rest.strip())
    if not name:
        raise UnknownModelError(spec, KNOWN_SCHEMES, "the model name is empty")
    options = dict(options)
    if scheduler is not None and factory is not _scripted and "limiter" not in options:
        options["limiter"] = ProviderLimiter(  # what the provider would make, on the clock
            max_concurrency=options.pop("max_concurrency", None),
            requests_per_minute=options.pop("requests_per_minute", None),
            clock=scheduler.clock,
            sleep=scheduler.sleep,
        )
    return factory(spec, name, url, options)
