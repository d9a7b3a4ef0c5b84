"""Durable facts: the session event vocabulary, its codec, the LMDB log and projections."""

__all__: list[str] = []
