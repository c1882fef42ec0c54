"""The pool as a library, usable without HTTP."""
