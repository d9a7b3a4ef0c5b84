"""Real model providers: OpenAI-compatible endpoints and Anthropic's Messages API.

Each provider implements :class:`actors.model.Model` over :mod:`.http` (``aiohttp``,
imported only when a provider is built: ``pip install 'corral[providers]'``), streams
into the chunk vocabulary of :mod:`storage.events`, and raises every failure as
:class:`actors.model.ModelError` with a CONTRACT section 5 code.
"""

from .anthropic_messages import AnthropicModel
from .base import HttpProvider
from .failures import classify, retry_after_seconds
from .limits import FairSemaphore, LimiterStatistics, ProviderLimiter, RateBucket, TokenBudget
from .openai_compat import OpenAICompatModel
from .process import ProcessModel
from .resolve import KNOWN_SCHEMES, UnknownModelError, resolve_model
from .secrets import MissingCredentialsError, Secret, scrub

__all__ = [
    "KNOWN_SCHEMES",
    "AnthropicModel",
    "FairSemaphore",
    "HttpProvider",
    "LimiterStatistics",
    "MissingCredentialsError",
    "OpenAICompatModel",
    "ProcessModel",
    "ProviderLimiter",
    "RateBucket",
    "Secret",
    "TokenBudget",
    "UnknownModelError",
    "classify",
    "resolve_model",
    "retry_after_seconds",
    "scrub",
]
