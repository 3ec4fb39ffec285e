"""Methods, one module each, behind the `Method` interface of `base.py`; each declares itself and its capabilities
with a module-level `SPEC = MethodSpec(...)`, which `evalsuite.catalog` reads without importing the module.
Importing this package imports no method: `get_method(name).factory` imports one when it is built."""
