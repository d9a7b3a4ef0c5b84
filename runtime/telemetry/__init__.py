"""OpenTelemetry for corral: ``instrument(rt)`` (needs the ``telemetry`` extra)."""

from .instrumentation import Instrumentation, instrument

__all__ = ["Instrumentation", "instrument"]
