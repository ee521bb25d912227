"""DDP's rendezvous store on the loopback interface for single-node runs.

PyTorch's ``env://`` rendezvous starts its key-value store (``TCPStore``) on rank 0 listening on
**every** interface, without authentication, on ``MASTER_PORT``: on a shared machine anyone who can
reach the port can join or disturb the job. ``TCPStore`` has no bind address, but it accepts an
already-listening socket (``master_listen_fd``). For a single-node run whose processes Lightning
starts itself, :func:`host_store_on_loopback` opens that socket on ``127.0.0.1`` in the launching
process and tells the ranks (``TORCHELASTIC_USE_AGENT_STORE``, inherited by the children Lightning
starts) to connect to it as clients instead of starting their own.

The ranks' own gloo connections (the collectives' pairs) are kept on the loopback too:
``GLOO_SOCKET_IFNAME`` names the loopback interface unless the user set it (gloo otherwise binds
to the address the host name resolves to, a network address on many machines).

Multi-node runs (and ranks started by ``srun`` or ``torchrun``) are left alone: their store must be
reachable from the other nodes (docs/reliability.md says what that exposes).
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
import struct

from vaco.lightning_private import ddp_timeout

__all__ = ["host_store_on_loopback", "loopback_interface", "LOOPBACK"]

LOOPBACK = ("127.0.0.1", "localhost")


def host_store_on_loopback(trainer):
    """Start rank 0's rendezvous store on 127.0.0.1 before Lightning starts the other ranks.

    Returns the store and its socket (keep both alive for the run) or ``None`` where it does not apply: one
    process, several nodes, ranks started outside Lightning, a ``MASTER_ADDR`` that is not the
    loopback, or a child rank (which connects to the store as a client).
    """
    import torch.distributed as dist
    from lightning.fabric.plugins.environments import LightningEnvironment

    strategy = trainer.strategy
    env = getattr(strategy, "cluster_environment", None)
    if trainer.world_size <= 1 or trainer.num_nodes != 1 or type(env) is not LightningEnvironment:
        return None
    if "LOCAL_RANK" in os.environ or env.main_address not in LOOPBACK:  # a child rank, or the user's own address
        return None
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", env.main_port))
    listener.listen(128)
    timeout = ddp_timeout(strategy, datetime.timedelta(minutes=30))
    store = dist.TCPStore(
        "127.0.0.1",
        env.main_port,
        trainer.world_size,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=listener.fileno(),
    )
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # every rank (and this one) connects as a client
    # the ranks' own gloo connections: gloo binds them to the address the host name resolves to (off
    # the loopback where it resolves to a network address) unless told an interface
    interface = loopback_interface()
    if interface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    return store, listener


def loopback_interface() -> str | None:
    """The name of the loopback network interface (``lo`` on Linux), or None if none is found."""

    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:  # SIOCGIFADDR: the interface's IPv4 address
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        if socket.inet_ntoa(packed[20:24]).startswith("127."):
            return name
    return None
