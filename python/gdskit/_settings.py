"""gdskit.settings: the process-wide settings of the C++ core, by name.

    gdskit.settings.threads                   # 8 (an int; byte counts are ints, switches bools, modes strs)
    gdskit.settings.chunk_bytes = "1M"        # set in code: wins over GDSKIT_CHUNK_BYTES and device profiles
    del gdskit.settings.chunk_bytes           # back to the environment, or the default
    with gdskit.settings(direct="off", threads=4):
        ...                                   # everything as it was after the block, errors included
    print(gdskit.settings)                    # name, value, where it came from
    gdskit.settings.describe()                # the same as a list of dicts

Precedence, strongest first: a value set in code > the GDSKIT_* variable > a device's profile (tuned or learned;
the O_DIRECT depth and request sizes, per device, while transfers run) > the default. The settings are one
object for the whole process, safe to read and change from any thread; a change affects files opened afterwards.
The `with` block changes them for every thread while it runs. docs/settings.md has the table.
"""

from __future__ import annotations

import sys

from . import _gdskit

__all__ = ["Settings", "settings"]


def _say_learned():
    """Prints, on stderr, the one line that says a load or save remembered a device's shape in the profile folder
    (GDSKIT_LEARN; `gdskit tune --show` lists it, `gdskit tune --forget` drops it), when it did."""
    line = _gdskit.take_learned_notice()
    if line:
        print(line, file=sys.stderr, flush=True)


class Settings:
    """The process-wide settings (the module attribute gdskit.settings is the one instance)."""

    __slots__ = ()

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return _gdskit.settings_get(name)

    def __setattr__(self, name, value):
        _gdskit.settings_set(name, value)

    def __delattr__(self, name):
        _gdskit.settings_reset(name)

    def __dir__(self):
        return sorted(e["name"] for e in _gdskit.settings_describe()) + ["describe", "reset"]

    def describe(self) -> list:
        """[{name, value, text, source ("default", "environment" or "code"), variable (GDSKIT_*), help, note}]
        in the order of docs/settings.md's table; `note` says what else decides the value in use, if anything."""
        return _gdskit.settings_describe()

    def reset(self, *names):
        """Gives the named settings (all when none is named) back to the environment, or to their defaults."""
        for name in names or [e["name"] for e in _gdskit.settings_describe()]:
            _gdskit.settings_reset(name)

    def __call__(self, **values):
        """A context manager that sets `values` for the block and then puts every setting back as it was."""
        return _Changed(values)

    def __repr__(self):
        rows = _gdskit.settings_describe()
        width = max(len(e["name"]) for e in rows)
        lines = []
        for e in rows:
            where = e["source"] if e["source"] != "environment" else f"environment ({e['variable']})"
            note = f"; {e['note']}" if e["note"] else ""
            lines.append(f"{e['name']:<{width}}  {e['text']:<8}  {where}{note}")
        return "\n".join(lines)


class _Changed:
    __slots__ = ("_values", "_saved")

    def __init__(self, values):
        self._values = values
        self._saved = None

    def __enter__(self):
        self._saved = _gdskit.settings_save()
        try:
            for name, value in self._values.items():
                _gdskit.settings_set(name, value)
        except BaseException:
            _gdskit.settings_restore(self._saved)
            raise
        return settings

    def __exit__(self, *exc):
        _gdskit.settings_restore(self._saved)
        return False


settings = Settings()
