"""kparity oracles: pure NumPy (+ ml_dtypes) references, one module per op family.

Every module in this package that defines ops registers them with `oracle.spec.register` at import
time; `load_all()` imports them all, so adding an op family is adding a module here.
"""

import importlib
import pkgutil

_loaded = False


def load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    # every public module: a helper (numerics, spec, ...) registers nothing, which is harmless,
    # so no list of helpers is kept beside the modules
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
