"""Encrypted kernel connections, so that kernels a build starts do not warn.

:func:`provision_curve_keys` is called once in the process that runs ``jupyter-book``
(``scripts/build_book.py``); the parallel readers Sphinx forks inherit it.
"""

from __future__ import annotations

__all__ = ["provision_curve_keys"]


def provision_curve_keys() -> None:
    """Give every kernel a fresh CurveZMQ key pair, so kernels start encrypted and quiet.

    jupyter_client starts kernels over TCP on 127.0.0.1, and ipykernel (7.x) then logs
    "Kernel is running over TCP without encryption" to stderr once per kernel: dozens of
    times per build. ``ConnectionFileMixin`` writes ``curve_publickey`` and
    ``curve_secretkey`` into the connection file when they are set, the kernel then
    encrypts its sockets and the client (``km.client()``, which reads the same connection
    info) authenticates with the public key. The keys are made when the connection file
    is first written, one pair per kernel. (The IPC transport would also silence the
    warning, but its socket paths default to ``kernel-ipc-N`` in the working directory,
    which pages executing in parallel in one chapter folder would share.)
    """
    import zmq
    from jupyter_client.connect import ConnectionFileMixin

    if getattr(ConnectionFileMixin.write_connection_file, "provisions_curve_keys", False):
        return
    if not zmq.has("curve"):
        return  # libzmq built without CurveZMQ: kernels stay on plain TCP (and warn)
    write = ConnectionFileMixin.write_connection_file

    def write_connection_file(self: ConnectionFileMixin, **kwargs: object) -> None:
        if self.curve_secretkey is None:
            self.curve_publickey, self.curve_secretkey = zmq.curve_keypair()
        write(self, **kwargs)

    write_connection_file.provisions_curve_keys = True  # type: ignore[attr-defined]
    ConnectionFileMixin.write_connection_file = write_connection_file  # type: ignore[method-assign]
