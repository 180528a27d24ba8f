"""The sandbox every job runs in (docs/security/sandbox.md).

Pure planning (:mod:`.limits`, :mod:`.seccomp`, :mod:`.plan`) is kept apart from the thin I/O:
:mod:`.probe` (which mode this host allows), :mod:`.host` (the runner's side of a warm
sandboxed worker) and :mod:`.inner` (the worker inside the sandbox, standard library only).
"""
