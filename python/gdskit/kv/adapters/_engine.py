"""Engine base classes, imported only when the engine is installed."""

from __future__ import annotations

import importlib


def engine_attr(module: str, name: str, fallback):
    """getattr(import_module(module), name) when the engine is installed, else `fallback`. Only the engine's own
    absence falls back: an engine that is installed but fails to import raises, so that a broken installation
    is not mistaken for a missing one."""
    root = module.split(".")[0]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (e.name == root or e.name.startswith(root + ".")):
            return fallback
        raise
    return getattr(mod, name)
