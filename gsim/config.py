"""Config dataclasses (DESIGN.md): ``to_dict`` / ``from_dict`` with a ``schema_version``."""
from __future__ import annotations

from dataclasses import asdict, fields
from typing import ClassVar
from .errors import InputError


class Config:
    """A mixin for frozen config dataclasses: ``to_dict()`` gives the fields and ``schema_version``;
    ``from_dict(d)`` is its inverse (missing fields take their defaults; a wrong version or an unknown
    field is a ValueError naming the class and the field)."""

    SCHEMA_VERSION: ClassVar[int] = 1

    def to_dict(self) -> dict:
        return {"schema_version": self.SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict):
        name = cls.__name__
        if not isinstance(d, dict) or d.get("schema_version") != cls.SCHEMA_VERSION:
            raise InputError(f"{name}.schema_version: expected {cls.SCHEMA_VERSION}, got "
                             f"{d.get('schema_version') if isinstance(d, dict) else d!r}")
        unknown = set(d) - {f.name for f in fields(cls)} - {"schema_version"}
        if unknown:
            raise InputError(f"{name}: unknown fields {sorted(unknown)}")
        return cls(**{k: v for k, v in d.items() if k != "schema_version"})
