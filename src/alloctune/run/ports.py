"""A rendezvous port of its own for every trial, so distributed trials side by side do not collide (#15).

Two trials of `torchrun --nproc-per-node 2 train.py` started at once both bind the static
rendezvous port 29500 (torchrun of torch 2.11, the H200 sweep; it reads every option also from
`PET_<OPTION>`), and so do scripts that call `init_process_group("env://")` themselves and
default `MASTER_PORT` to 29500: the second dies with EADDRINUSE, a `crash` the allocator setting
never caused. So each trial's child gets a free port in `PET_MASTER_PORT` and `MASTER_PORT`; a
workload that is not distributed never reads them. A newer torchrun that picks a free port itself
for a single-node job (2.13: c10d on localhost:0) then uses the static rendezvous on ours instead:
still no collision.

Left alone: a variable the user set (theirs wins; `shared_port_note` says the trials may collide),
a port variable whose address variable the user set (the job may span hosts, and every node must
agree on the port), and a command that fixes the rendezvous with torchrun's own flags (they beat
the variables anyway).
"""

from __future__ import annotations

import socket
import threading
from collections import deque
from typing import Mapping, Sequence

# (port variable, the address variable read with it): torchrun reads PET_*, env:// scripts MASTER_*.
PORT_VARS = (("PET_MASTER_PORT", "PET_MASTER_ADDR"), ("MASTER_PORT", "MASTER_ADDR"))
# torchrun flags that settle the rendezvous port on the command line (either spelling, `--flag=value` too).
PORT_FLAGS = ("--master-port", "--master_port", "--rdzv-endpoint", "--rdzv_endpoint", "--standalone")
# torchrun's address flag: like PET_MASTER_ADDR, the job may span hosts.
ADDR_FLAGS = ("--master-addr", "--master_addr")

_RECENT: deque[int] = deque(maxlen=64)  # ports this process handed out lately
_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now: bind port 0, read what the kernel chose, close.

    Racy by nature, and accepted: another process may take the port in the second or two before
    the trial's launcher binds it. A port this process handed out lately is drawn again, so two
    trials started in the same instant never get the same one from here.
    """
    with _LOCK:
        for _ in range(16):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if port not in _RECENT:
                break
        _RECENT.append(port)
        return port


def _has_flag(command: Sequence[str], flags: Sequence[str]) -> bool:
    """Whether any argument is one of `flags` (a script's own --master-port most likely sets the port too)."""
    return any(arg.split("=", 1)[0] in flags for arg in command)


def _kept(command: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The port variables the user decided, directly or through an address (see the module doc)."""
    addr_flag = _has_flag(command, ADDR_FLAGS)  # torchrun's flag: it stands for PET_MASTER_ADDR
    return [port for port, addr in PORT_VARS if env.get(port) or env.get(addr) or (addr_flag and addr == "PET_MASTER_ADDR")]


def trial_port_env(command: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """The port variables to add to a trial's environment `env`: one fresh port for those not kept."""
    if _has_flag(command, PORT_FLAGS):
        return {}
    kept = _kept(command, env)
    todo = [port for port, _ in PORT_VARS if port not in kept]
    if not todo:
        return {}
    port = str(free_port())
    return {name: port for name in todo}


def shared_port_note(command: Sequence[str], env: Mapping[str, str]) -> str | None:
    """For a sweep that runs trials side by side: why they may collide, when the user's env pins the port."""
    if _has_flag(command, PORT_FLAGS):
        return None
    set_by_user = [name for pair in PORT_VARS for name in pair if env.get(name)]
    if _has_flag(command, ADDR_FLAGS):
        set_by_user.append("--master-addr")
    if not set_by_user:
        return None
    return (
        f"{', '.join(set_by_user)} set by you: trials side by side of a distributed job may collide on the same "
        "rendezvous port (a crash that is not the setting's); unset it, or run one trial at a time"
    )
