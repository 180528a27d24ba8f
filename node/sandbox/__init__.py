"""The sandbox every job runs in (docs/security/sandbox.md).

Pure planning (:mod:`.limits`, :mod:`.seccomp`, :mod:`.plan`) is kept apart from the thin I/O:
:mod:`.probe` (which mode this host allows), :mod:`.worker` (starting a sandboxed worker, its
life on the runner's side), :mod:`.host` (a warm worker's job conversation), :mod:`.reap`
(killing and reaping its processes), :mod:`.cgroups` (its cgroup leaf) and :mod:`.inner` (the
worker inside the sandbox, standard library only).
"""
