"""Config dataclasses (docs/architecture.md): ``to_dict`` / ``from_dict`` with a ``schema_version``."""
from __future__ import annotations

from dataclasses import asdict, fields
from typing import ClassVar

from .errors import InputError
from .io import check_schema_version


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
        if not isinstance(d, dict):
            raise InputError(f"{name}: expected an object, got {type(d).__name__}")
        check_schema_version(d, (cls.SCHEMA_VERSION,), name)
        unknown = set(d) - {f.name for f in fields(cls)} - {"schema_version"}
        if unknown:
            raise InputError(f"{name}: unknown fields {sorted(unknown)}")
        return cls(**{k: v for k, v in d.items() if k != "schema_version"})
