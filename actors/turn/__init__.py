"""The turn machine of the seeds, split by phase: the loop (:mod:`.machine`), a step's
model exchange (:mod:`.reply`, with the reply's assembly in :mod:`.assembly`), a failed
request's retry decision (:mod:`.retry`), and the effects it awaits (:mod:`.effects`)."""

from .machine import Durability, TurnMachine

__all__ = ["Durability", "TurnMachine"]
