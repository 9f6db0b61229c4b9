"""mlx-lm's model files without its package __init__, so that `streamer plan` starts at once.

`mlx_lm/__init__.py` imports mlx_lm.convert, generate and utils, and utils' tokenizer_utils imports
transformers (and torch with it): seconds, for a plan that needs only the model classes, which
import nothing but mlx. Inside `models_without_package_init()`, sys.modules["mlx_lm"] is mlx-lm's
own package module made from its spec with its __init__ not run, so `mlx_lm.models.*` import
beneath it. When the block ends that module leaves sys.modules (the model files stay), and a finder
first on sys.meta_path runs the real __init__ in that same module object at the next import of
mlx_lm or of any mlx_lm.X (which imports its parent first): from then on all is as if `import
mlx_lm` had come first, mlx_lm.models.* the same modules and classes. A module attribute read on
the unfinished package (code that kept it) finishes it too (PEP 562 __getattr__).

Why the package leaves sys.modules rather than waiting there for a first attribute read: an
`import mlx_lm.generate` under it would run before the __init__ and bind the submodule where the
__init__ binds the function mlx_lm.generate (the import system sets a submodule on its parent;
only a later __init__ would bind the function again), and there is no hook between the import
system finding mlx_lm in sys.modules and its loading a submodule.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

PACKAGE = "mlx_lm"
_lock = threading.RLock()
_pending: ModuleType | None = None  # the package module whose __init__ has not run


@contextmanager
def models_without_package_init() -> Iterator[None]:
    """While this lasts, `mlx_lm.models.*` import without mlx-lm's package __init__ (if mlx_lm is
    imported already, they simply import)."""
    global _pending
    with _lock:
        if PACKAGE in sys.modules:  # imported already (or this block's, nested)
            yield
            return
        if _pending is None:
            _pending = _unexecuted_package()
            sys.meta_path.insert(0, _FINISHER)
        sys.modules[PACKAGE] = _pending
        try:
            yield
        finally:
            if _pending is not None and sys.modules.get(PACKAGE) is _pending:
                del sys.modules[PACKAGE]  # the next import of mlx_lm runs its __init__ in it


def model_file(name: str) -> ModuleType:
    """`mlx_lm.models.<name>`, imported without mlx-lm's package __init__."""
    with models_without_package_init():
        return importlib.import_module(f"{PACKAGE}.models.{name}")


def package_version() -> str:
    """mlx_lm.__version__, without mlx-lm's package __init__."""
    with models_without_package_init():
        return importlib.import_module(f"{PACKAGE}._version").__version__


def package_folder() -> Path:
    """mlx-lm's package folder, found without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"No module named {PACKAGE!r}", name=PACKAGE)
    return Path(next(iter(spec.submodule_search_locations)))


def _unexecuted_package() -> ModuleType:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {PACKAGE!r}", name=PACKAGE)
    module = importlib.util.module_from_spec(spec)

    def __getattr__(name: str):  # PEP 562: only for names the module lacks
        with _lock:
            if module is _pending:  # finished as any import of mlx_lm finishes it
                sys.modules.pop(PACKAGE, None)
                importlib.import_module(PACKAGE)
        return getattr(module, name)  # an AttributeError for a name the __init__ lacks too

    module.__getattr__ = __getattr__
    return module


class _Finisher(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The next import of mlx_lm loads the pending package module: its __init__ run in it."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != PACKAGE or _pending is None:
            return None
        real = _pending.__spec__  # the import system sets the spec returned here on the module
        spec = importlib.machinery.ModuleSpec(
            PACKAGE, self, origin=real.origin, loader_state=real, is_package=True
        )
        spec.submodule_search_locations = real.submodule_search_locations
        return spec

    def create_module(self, spec):
        return _pending  # not a new module: the one mlx_lm.models.* were imported under

    def exec_module(self, module):
        global _pending
        with _lock:
            module.__spec__ = module.__spec__.loader_state  # mlx-lm's own spec and loader again
            _pending = None
            del module.__getattr__
            sys.meta_path.remove(self)
            module.__spec__.loader.exec_module(module)


_FINISHER = _Finisher()
