"""What the elastic benches share: logging, bounded waits, the peers'
JSON-lines progress files and free loopback ports."""
import json
import os
import signal
import socket
import sys
import time


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def wait_until(predicate, timeout, what, poll=0.02):
    """predicate()'s first true value, looked at every `poll` seconds;
    TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


class Progress:
    """A JSON-lines progress file, read as it grows (a partial last line
    waits for the next poll)."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.events = []

    def poll(self):
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        cut = data.rfind(b"\n") + 1
        self.offset += cut
        self.events += [json.loads(l) for l in data[:cut].decode().splitlines() if l.strip()]

    def of(self, event, **match):
        return [e for e in self.events
                if e["event"] == event and all(e.get(k) == v for k, v in match.items())]

    def kill_rank_at(self, rank, step, what):
        """Waits (up to 120 s) until `rank` of the first run has logged `step`
        steps, kills its process with SIGKILL and returns the time of the kill."""
        def ready():
            self.poll()
            return len(self.of("step", restart=0, rank=rank)) >= step
        wait_until(ready, 120, f"{what}: rank {rank} reaching step {step}")
        os.kill(self.of("pid", restart=0, rank=rank)[0]["pid"], signal.SIGKILL)
        return time.time()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
