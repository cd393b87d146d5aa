"""The process: ``pgsub``'s commands, the daemon, its config, HTTP endpoint and logs.

It owns the configuration and wires every other package together: one
supervisor per subscription (``subscription``), the maintenance thread, the
admin commands (``admin``, ``status``) and ``pgsub demo``.
"""
