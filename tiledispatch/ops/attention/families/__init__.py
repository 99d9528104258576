"""Attention's kernel families, one module each (`sdpa` and `bwd` hold two closely tied ones).
Importing this package imports every module in it, and each registers its families in
`config.FAMILIES`: a new family is a new module here, with no list to extend."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
