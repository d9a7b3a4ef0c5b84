"""Live machinery: dispatcher, I/O side, bus, agent actor and turn machine, registry."""

__all__: list[str] = []
