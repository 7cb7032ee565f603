"""Components named in a config file: an entry point of the section's group, or
``module:factory`` (a module on the import path, or beside the config file)."""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainkit.cli._schema import ConfigError
from trainkit.core import plugins

__all__ = ["choices", "config_folder", "resolve"]


def choices(group: str) -> str:
    """The installed names of ``group``, for a message."""
    installed = plugins.available(group)
    return f"name one of the installed {group}: {', '.join(installed) or 'none'} (or use 'module:factory')"


def resolve(group: str, name: str) -> Any:
    """An entry point of ``group`` by name, or ``module:attribute``. A module that is not on
    the import path is also looked for beside the config file (as Python finds modules
    beside a script), whose folder is then added to the path."""
    if ":" in name:
        module, _, attribute = name.partition(":")
        try:
            return getattr(_import_module(module), attribute)
        except ModuleNotFoundError as err:
            raise ConfigError(_not_importable(name, module, err)) from err
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"cannot import {name!r}: {err}") from err
    installed = plugins.available(group)
    if name not in installed:
        suggestion = plugins.did_you_mean(name, installed)
        if suggestion:
            raise ConfigError(
                f"unknown name {name!r}{suggestion} (`trainkit plugins` lists the "
                f"{len(installed)} installed in {group}; or use 'module:factory')"
            )
        raise ConfigError(
            f"unknown name {name!r}; installed in {group}: {', '.join(installed) or 'none'} "
            "(or use 'module:factory')"
        )
    return plugins.load(group, name)


_CONFIG_FOLDER: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "config_folder", default=None
)
"""The folder of the config file being validated (None: the embedded default)."""


@contextlib.contextmanager
def config_folder(folder: Path | None) -> Iterator[None]:
    """Within: ``module:factory`` names may also find modules in ``folder``."""
    token = _CONFIG_FOLDER.set(folder)
    try:
        yield
    finally:
        _CONFIG_FOLDER.reset(token)


def _import_module(module: str) -> types.ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        folder = _CONFIG_FOLDER.get()
        top = module.split(".")[0]
        if err.name != top or folder is None or not _defines(folder, top):
            raise
        # Beside the config file: importable from now on (a factory may import its
        # neighbours when it is called, after validation); last, so that it shadows nothing.
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
        importlib.invalidate_caches()
        return importlib.import_module(module)


def _defines(folder: Path, top: str) -> bool:
    return (folder / f"{top}.py").is_file() or (folder / top).is_dir()


def _not_importable(name: str, module: str, err: ModuleNotFoundError) -> str:
    top = module.split(".")[0]
    if err.name != top:  # the module is there; something it imports is not
        return f"cannot import {name!r}: {err}"
    folder = _CONFIG_FOLDER.get()
    where = f"beside the config file ({folder}) nor " if folder is not None else ""
    return (
        f"cannot import {name!r}: there is no module {top!r} {where}on the import path. Put "
        f"{top}.py beside the config file, install the package that holds it, or add its "
        f"folder to the path: PYTHONPATH=/path/to/folder trainkit train ..."
    )
