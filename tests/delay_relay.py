"""A link with a delay, for kernels without tc's netem.

Moves IP packets between two TUN devices: INSIDE, in the namespace of the
host whose link is slowed (its only interface, carrying its address), and
OUTSIDE, in the namespace that routes for it. Every packet that leaves the
host (read from INSIDE) is written to OUTSIDE DELAY_MS later, as `tc qdisc
add dev IFACE root netem delay DELAY_MS` on the host's interface would
delay it; packets towards the host pass at once. The delay is on only
between SIGUSR1 and SIGUSR2, so a test can set up the link first and slow
it for a window; packets keep their order when it changes. Both devices
exist beforehand (`ip tuntap add NAME mode tun`), addressed and up; the
process starts in OUTSIDE's namespace and enters INSIDE's (a
/run/netns file) to attach to it. It exits after MAX_SECONDS, or when the
process PARENT is gone.

Usage: delay_relay.py OUTSIDE INSIDE_NETNS_FILE INSIDE DELAY_MS MAX_SECONDS PARENT
"""

import collections
import ctypes
import fcntl
import os
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000


def attach(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def enter_netns(path):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns " + path)
    os.close(fd)


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def main():
    outside_name, netns_file, inside_name = sys.argv[1:4]
    delay_s = float(sys.argv[4]) / 1000.0
    deadline = time.monotonic() + float(sys.argv[5])
    parent = int(sys.argv[6])
    outside = attach(outside_name)
    enter_netns(netns_file)
    inside = attach(inside_name)

    slowed = [False]
    signal.signal(signal.SIGUSR1, lambda *_: slowed.__setitem__(0, True))
    signal.signal(signal.SIGUSR2, lambda *_: slowed.__setitem__(0, False))
    leaving = collections.deque()  # (due, packet) from INSIDE, in order
    print("relaying %s <-> %s" % (inside_name, outside_name), flush=True)
    last_check = 0.0
    while time.monotonic() < deadline:
        now = time.monotonic()
        if now - last_check > 1.0:
            if not alive(parent):
                return
            last_check = now
        timeout = 0.2 if not leaving else max(0.0, min(0.2, leaving[0][0] - now))
        try:
            readable, _, _ = select.select([inside, outside], [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd in readable:
            for _ in range(64):  # a burst at a time, so neither side starves
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if fd == outside:
                    write(inside, packet)
                else:
                    due = now + (delay_s if slowed[0] else 0.0)
                    if leaving and due < leaving[-1][0]:
                        due = leaving[-1][0]
                    leaving.append((due, packet))
        while leaving and leaving[0][0] <= now:
            write(outside, leaving.popleft()[1])


def write(fd, packet):
    try:
        os.write(fd, packet)
    except OSError:
        pass  # the device is down or full: the packet is lost, as on a link


if __name__ == "__main__":
    main()
