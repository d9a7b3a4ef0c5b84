"""API keys: where they come from and how they are kept out of every printed text.

A key is held in a :class:`Secret`, whose ``repr``/``str`` never show it. Every text a
provider lets out (an :class:`~storage.events.LlmFailure` message, an exception) goes
through :func:`scrub` first, which replaces the key, and anything shaped like a vendor
key, with ``***``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Final

from ..errors import MissingCredentialsError

__all__ = ["MASK", "MissingCredentialsError", "Secret", "resolve_api_key", "scrub"]

MASK: Final = "***"

# Vendor key shapes (OpenAI ``sk-…``/``sk-proj-…``, Anthropic ``sk-ant-…``), scrubbed even
# when the key is not one this process holds: a server may echo another one.
_KEY_SHAPE: Final = re.compile(r"\bsk-[A-Za-z0-9_\-]{12,}")
_MIN_SCRUB_LEN: Final = 4  # shorter "keys" (placeholders) would scrub ordinary words


class Secret:
    """A credential that never shows itself in ``repr``, ``str`` or a format string.

    Invariant: ``reveal()`` is only called where the value goes on the wire (a
    provider's request headers).
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Secret is not picklable; pass the key again where it is needed")


def resolve_api_key(
    provider: str,
    *,
    api_key: str | None,
    api_key_env: str | None,
    env_names: Iterable[str],
    required: bool,
    environ: Mapping[str, str] | None = None,
) -> Secret | None:
    """The key from explicit config, else ``api_key_env``, else the first set ``env_names``.

    Raises :class:`MissingCredentialsError` when ``required`` and nothing is found;
    otherwise returns ``None`` for "no key".
    """
    env = os.environ if environ is None else environ
    if api_key:
        return Secret(api_key)
    names = [api_key_env] if api_key_env else list(env_names)
    for name in names:
        value = env.get(name)
        if value:
            return Secret(value)
    if required:
        raise MissingCredentialsError(provider, names)
    return None


def scrub(text: str, secrets: Iterable[Secret | str | None] = ()) -> str:
    """``text`` with every given secret, and anything shaped like a vendor key, masked."""
    for secret in secrets:
        value = secret.reveal() if isinstance(secret, Secret) else secret
        if value and len(value) >= _MIN_SCRUB_LEN and value in text:
            text = text.replace(value, MASK)
    return _KEY_SHAPE.sub(MASK, text)
