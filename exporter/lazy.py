"""Libraries loaded when they are first used, not when the exporter starts.

`lazy_module(name)`: a module (sqlite3) executed on its first attribute, through the
standard library's LazyLoader, for what only some configurations use.

`install()`: prometheus_client's package, imported without its __init__ until someone
asks for it; and ssl, executed on its first attribute.

We use two of its modules (metrics_core: the Metric families; samples) and write the
exposition ourselves. Its __init__ imports everything else: the registry, the metric
classes, the exposition module with urllib.request, wsgiref and the push gateway client,
the process and platform collectors, ~2 MiB resident (docs/performance.md, memory).
`install()` registers the package with its search path only, so `import
prometheus_client.metrics_core` loads that module alone; the first attribute asked of the
package itself (`from prometheus_client import generate_latest`) runs its real __init__
then, so every other user of the library sees the library unchanged.

ssl is imported by http.client (which http.server imports), by our web config and the
Kubernetes client, all at start; it loads OpenSSL's libssl and libcrypto, ~3.5 MiB
resident. Only TLS serving, the Kubernetes API or an HTTPS health check use it, so it
runs on the first attribute asked of it (the context a TLS web config builds at start),
and a plain-HTTP exporter never loads it (docs/performance.md, memory).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types

NAME = "prometheus_client"
DEFERRED = ("ssl",)  # stdlib modules executed on first use
_lock = threading.RLock()


class _Deferred(types.ModuleType):
    """A module registered by its spec alone; its code runs, into this same object, on the
    first attribute asked of it that it does not have yet (under a lock: the first of
    two threads runs it, the other waits)."""

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
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}"
                                 ) from None


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


def loaded(module: types.ModuleType) -> bool:
    """Whether a module's code has run (False for a deferred one not yet asked for)."""
    return not isinstance(module, _Deferred) or bool(module.__dict__.get("_cte_loaded"))


def defer(name: str) -> None:
    """Register `name` (a package: without running its __init__) to run on its first
    attribute; no-op when it is imported already, or not installed."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return
    module = _Deferred(name)
    module.__spec__ = spec
    module.__file__ = spec.origin
    module.__loader__ = spec.loader
    if spec.submodule_search_locations is not None:  # a package: its modules import alone
        module.__path__ = list(spec.submodule_search_locations)
        module.__package__ = name
    else:
        module.__package__ = name.rpartition(".")[0]
    sys.modules[name] = module


def install() -> None:
    """prometheus_client's package registered without running its __init__, and the
    DEFERRED modules without running them (each a no-op when already imported)."""
    defer(NAME)
    for name in DEFERRED:
        defer(name)
