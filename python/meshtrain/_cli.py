"""Keyword arguments as the words of a `meshtrain` command line, and the C++ half (_meshtrain).

The options are the program's own (read from its parser), so a keyword is accepted exactly
when the program has the flag: `zero=1` is `--zero 1`, `exact_sums=4` is `--exact-sums 4`, a
flag takes True (given) or False (left out), None leaves any option out, and a list is written
with commas (`pp_balance=[3, 5]` is `--pp-balance 3,5`).
"""

import functools
import os
import shutil


@functools.lru_cache(maxsize=None)
def native():
    """The extension module, with a note on how to build it when it is missing."""
    try:
        from . import _meshtrain
    except ImportError as e:
        raise ImportError("meshtrain's C++ extension (_meshtrain) is not built or not installed: build it with "
                          "cmake (target _meshtrain, into build/python) and install with "
                          "`pip install --no-index --no-build-isolation ./python` (docs/python.md)") from e
    return _meshtrain


@functools.lru_cache(maxsize=None)
def options(command):
    """{"--dp": False, "--resume": True, ...}: the command's options, True for a flag."""
    return dict(native().options(command))


def _value(v):
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return ",".join(_value(x) for x in v)
    return str(v)


def flags(command, kwargs, caller):
    """The words of `meshtrain COMMAND` for these keyword arguments (in their order).

    An unknown keyword raises TypeError naming it, as Python does for a function's arguments.
    """
    known = options(command)
    words = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if flag not in known or "-" in key:
            raise TypeError(f"{caller}() got an unexpected keyword argument '{key}': {flag} is not an option of "
                            f"`meshtrain {command}` (see `meshtrain {command} --help`)")
        if value is None:
            continue
        if known[flag]:
            if not isinstance(value, bool):
                raise TypeError(f"{caller}(): {key} is a flag ({flag}); give True or False, not {value!r}")
            if value:
                words.append(flag)
            continue
        words += [flag, _value(value)]
    return words


@functools.lru_cache(maxsize=None)
def program():
    """The `meshtrain` program that measures this machine for the cost model when no machine file
    is cached: $MESHTRAIN_PROGRAM, the build tree's (next to build/python), one installed with
    the package, or one on PATH; "" when there is none (then the run prints no prediction)."""
    env = os.environ.get("MESHTRAIN_PROGRAM")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "..", "..", "meshtrain"), os.path.join(here, "bin", "meshtrain")):
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return shutil.which("meshtrain") or ""
