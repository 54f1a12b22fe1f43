"""Libraries loaded when they are first used, not when the exporter starts.

`lazy_module(name)`: a module (sqlite3) executed on its first attribute, through the
standard library's LazyLoader, for what only some configurations use.

`install()`: prometheus_client's package, imported without its __init__ until someone
asks for it.

We use two of its modules (metrics_core: the Metric families; samples) and write the
exposition ourselves. Its __init__ imports everything else: the registry, the metric
classes, the exposition module with urllib.request, wsgiref and the push gateway client,
the process and platform collectors, ~2 MiB resident (docs/performance.md, memory).
`install()` registers the package with its search path only, so `import
prometheus_client.metrics_core` loads that module alone; the first attribute asked of the
package itself (`from prometheus_client import generate_latest`) runs its real __init__
then, so every other user of the library sees the library unchanged.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types

NAME = "prometheus_client"
_lock = threading.RLock()


class _LazyPackage(types.ModuleType):
    def __getattr__(self, attr: str) -> object:
        if attr.startswith("__") and attr != "__all__":
            raise AttributeError(attr)
        with _lock:
            if not self.__dict__.get("_cte_loaded"):
                self.__dict__["_cte_loaded"] = True
                spec = self.__spec__
                assert spec is not None and spec.loader is not None
                spec.loader.exec_module(self)  # the real __init__, into this module
        try:
            return self.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {NAME!r} has no attribute {attr!r}") from None


def lazy_module(name: str) -> types.ModuleType:
    """`name`, imported now if it is already, else executed on its first attribute."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def install() -> None:
    """Register prometheus_client's package without running its __init__ (no-op when it is
    imported already, or not installed)."""
    if NAME in sys.modules:
        return
    spec = importlib.util.find_spec(NAME)
    if spec is None or spec.submodule_search_locations is None:
        return
    module = _LazyPackage(NAME)
    module.__spec__ = spec
    module.__file__ = spec.origin
    module.__path__ = list(spec.submodule_search_locations)
    module.__package__ = NAME
    module.__loader__ = spec.loader
    sys.modules[NAME] = module
