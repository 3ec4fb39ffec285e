"""Methods, one module each, behind the `Method` interface of `base.py`; `evalsuite.catalog` lists them and their
settings. Importing this package imports no method: `get_method(name).factory` imports one when it is built."""
