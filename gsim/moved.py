"""Old module paths that keep working after their modules moved into subpackages: importing the old name imports
the module at its new place and binds the old name to that same module object (no copy, no second import).

A layer's package lists its moved modules (`alias`): public paths that users write (a converter's module, the
network client, the Gymnasium environment's id) stay quietly; the rest warn with a FutureWarning (shown to users by
default) and go in the next release."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Dict


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names; loading one puts the new module in its place (the import system reads sys.modules back
    after `exec_module`, so the importer receives the new module itself)."""

    def __init__(self):
        self.targets: Dict[str, tuple] = {}  # old name -> (new name, warn)

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in self.targets else None

    def create_module(self, spec):
        return None  # a placeholder module, replaced in exec_module

    def exec_module(self, module) -> None:
        new, warn = self.targets[module.__name__]
        if warn:  # (the import system's own frames are skipped: the warning names the importing line)
            warnings.warn(f"{module.__name__} moved to {new}; the old name goes in the next release", FutureWarning,
                          stacklevel=2)
        sys.modules[module.__name__] = importlib.import_module(new)


_ALIASES = _Aliases()


def alias(package: str, moved: Dict[str, str], warn: bool) -> None:
    """Old modules of ``package`` ({old name: new name}, both relative to it) importable by their old names; with
    ``warn``, each first import of an old name warns that it goes in the next release."""
    if _ALIASES not in sys.meta_path:
        sys.meta_path.insert(0, _ALIASES)
    _ALIASES.targets.update({f"{package}.{old}": (f"{package}.{new}", warn) for old, new in moved.items()})
