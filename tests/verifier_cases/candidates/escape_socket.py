"""ESCAPE (rowsum problem): opens network sockets: a TCP connection to a listener of the test on
127.0.0.1 (EGG_ESCAPE_PORT), a UDP datagram to it, an IPv6 socket. With the static check off
every one fails (seccomp, a network namespace, Landlock's TCP rules) and the listener receives
nothing: runtime error "escape: ..."."""
import os
import socket

import torch
import torch.nn as nn


def attempt() -> str:
    port = int(os.environ.get("EGG_ESCAPE_PORT", "9"))
    got = []
    for label, fam, kind in (("tcp", socket.AF_INET, socket.SOCK_STREAM),
                             ("udp", socket.AF_INET, socket.SOCK_DGRAM),
                             ("tcp6", socket.AF_INET6, socket.SOCK_STREAM)):
        try:
            s = socket.socket(fam, kind)
            s.settimeout(3)
            if kind == socket.SOCK_DGRAM:
                s.sendto(b"escaped", ("127.0.0.1", port))
            else:
                s.connect(("127.0.0.1" if fam == socket.AF_INET else "::1", port))
                s.sendall(b"escaped")
            s.close()
            got.append(f"{label}=sent")
        except OSError as e:
            got.append(f"{label}={type(e).__name__}")
    return " ".join(got)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        raise RuntimeError("escape: " + attempt())
