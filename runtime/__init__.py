"""What users touch: the Runtime facade, Agent handle, models, tools, policies, CLI."""

__all__: list[str] = []
