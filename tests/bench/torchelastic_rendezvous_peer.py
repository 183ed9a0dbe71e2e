#!/usr/bin/python3
"""TorchElastic dynamic-rendezvous peer: how long N participants take to rendezvous.

What it measures
    The wall time of one round of TorchElastic's dynamic rendezvous (the one
    torchrun uses with --rdzv_backend c10d) for N participants:
    DynamicRendezvousHandler over C10dRendezvousBackend, whose state lives in a
    torch.distributed.TCPStore on 127.0.0.1.

    Per run, a fresh master TCPStore (port 0, is_master=True,
    wait_for_workers=False) is created in the main thread and a fresh run_id is
    used. Each of the N participants is a Python thread that opens its OWN
    client TCPStore to that port (one TCP connection per participant, as N
    separate processes would have), builds its own C10dRendezvousBackend and
    DynamicRendezvousHandler.from_backend(..., min_nodes=N, max_nodes=N), and
    then waits. That setup is not timed. The main thread then takes t0 and
    releases all participants at once (threading.Event); each calls
    next_rendezvous(). The measured time is from t0 to the moment the LAST
    next_rendezvous() returns. Every participant must get a distinct rank in
    0..N-1 and world size N, or the run fails.

    The run is repeated --runs times (fresh store, fresh run_id) and the median
    is reported.

How to run (Debian's python3-torch; a plain `python3` may have no torch)
    /usr/bin/python3 tests/bench/torchelastic_rendezvous_peer.py --participants 64 --runs 3

    Other options: --join-timeout S (default 120; also bounds each run),
    --last-call S (default 1), --setup-timeout S (default 60),
    --cheap-method-name (diagnostic, see the caveats). Unless PYTHONMALLOC is
    set, the script re-executes itself once with PYTHONMALLOC=malloc (see the
    caveats).

    Human-readable lines come first; the last stdout line is one JSON object:
    {"participants": N, "median_seconds": X, "runs": [...],
     "store": "tcpstore", "handler": "DynamicRendezvousHandler/C10dRendezvousBackend"}
    Exit code 0 on success, 1 on any failure (error, wrong ranks, or a
    rendezvous that did not finish within the bound; every wait is bounded).

Caveats (read before comparing numbers)
    * The participants are threads of ONE Python process, so they share the
      GIL. The rendezvous is CPU-heavy Python on every participant (pickle and
      base64 of the whole shared state on each compare-and-set, state size
      growing with N), so N threads contend for one interpreter where N
      processes would run in parallel on separate cores. This makes the peer
      SLOWER than a real N-process (or N-node) torchrun rendezvous
      would be on a machine with enough cores; on the other hand there is no
      network latency here (loopback). Treat the result as indicative.
    * Most of that Python work, in torch 1.13 (and still in current releases),
      is dynamic_rendezvous.get_method_name(): every internal event record
      calls inspect.stack() twice (about 1 ms or more per call, it reads
      source files for every frame) just to name the event, and then drops the
      event because the default event handler is a NullHandler. Under one GIL
      these calls are serialized, which stretches every compare-and-set cycle,
      so many more writes go stale and are retried (see "sets" below). With
      --cheap-method-name the function is replaced by a sys._getframe() lookup
      that returns the same name; on a 2-CPU machine that took N=64 from
      about 2-6 s down to the ~1.3 s floor. That option is a diagnostic, not
      stock torch: the JSON line then carries "get_method_name":
      "sys._getframe". In real separate processes the inspect.stack() cost is
      paid in parallel, so a real N-process rendezvous should land between the
      two numbers.
    * Structural floor, not a measurement artefact: in torch 1.13 a participant
      that has joined and is waiting for the others polls the store with a
      fixed 1 s sleep (_Action.SYNC -> _delay(1)), the state holder caches the
      state for 1 s, and each handler sleeps a random 0..0.3 s before its first
      attempt. So a round cannot finish much faster than ~1-2 s even for N=2,
      and results are quantized by those polls.
    * All participants update ONE store key with optimistic compare_set; a
      writer whose state is stale retries, so the number of store round trips
      grows roughly with N^2. The per-run "sets"/"set_ok" counts printed below
      show this.
    * last_call: with min_nodes == max_nodes the last_call timeout does not
      delay completion: _add_to_participants() sets the last-call deadline when
      len(participants) reaches min_nodes and, in the same step, marks the
      round complete because it also reached max_nodes. It must still be
      positive, so a short value (1 s) is passed.
    * torch 1.13's from_backend() has no local_addr parameter (newer releases
      added it) and hard-codes keep_alive_interval=5 s / 3 attempts. The
      keep-alive timer only starts after next_rendezvous() returns, so it does
      not slow completion; a waiting participant only adds a heartbeat write if
      its own last heartbeat is older than 5 s. Timers are stopped after each
      run so they cannot disturb the next one.
    * torch 1.13 bug worked around here: the Python binding of
      Store.compare_set() (the one atomic operation C10dRendezvousBackend is
      built on) releases the GIL for its whole body, including creating the
      returned bytes object. With several Python threads that allocation runs
      concurrently with other threads and corrupts pymalloc's free lists:
      random segfaults (seen in roughly every second 64-participant process).
      `PYTHONMALLOC=debug` reports "Python memory allocator called without
      holding the GIL" at c10d_rendezvous_backend.py's compare_set call, and
      with compare_set replaced by a Python emulation it reports nothing else.
      PyTorch fixed this in 2024 (pytorch/pytorch#128212, "Ensure gil is not
      released when calling toPyBytes"). One process per participant, as
      torchrun runs it, is not exposed. Workaround used: unless PYTHONMALLOC
      is already set, the script re-executes itself once with
      PYTHONMALLOC=malloc, so object allocation goes to the thread-safe libc
      malloc; the store protocol and the TorchElastic code are unchanged. The
      cost is the usual small pymalloc-vs-malloc difference for the whole
      interpreter.
    * The C10dRendezvousBackend used here is a thin subclass that only counts
      get/set calls (per participant, no locking); it adds no store traffic.
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta

# See "torch 1.13 bug worked around here" above: make object allocation
# thread-safe before torch is imported. An explicit PYTHONMALLOC is respected.
if "PYTHONMALLOC" not in os.environ:
    os.environ["PYTHONMALLOC"] = "malloc"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable] + sys.argv)

try:
    import torch
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )
except ImportError as exc:  # pragma: no cover - environment problem
    print(f"ERROR: cannot import torch ({exc}); run with /usr/bin/python3", flush=True)
    sys.exit(1)

MAX_RUNS = 10
MAX_PARTICIPANTS = 1024


class CountingC10dBackend(C10dRendezvousBackend):
    """C10dRendezvousBackend that counts its store operations (one per participant)."""

    def __init__(self, store, run_id):
        self.gets = 0
        self.sets = 0
        self.set_ok = 0
        super().__init__(store, run_id)

    def get_state(self):
        self.gets += 1
        return super().get_state()

    def set_state(self, state, token=None):
        self.sets += 1
        result = super().set_state(state, token)
        if result is not None and result[2]:
            self.set_ok += 1
        return result


class Participant:
    def __init__(self, index):
        self.index = index
        self.client_store = None
        self.backend = None
        self.handler = None
        self.rank = None
        self.world_size = None
        self.t_end = None
        self.error = None


def participant_main(p, port, run_id, n, timeouts, store_timeout, ready, go, go_wait_s):
    try:
        # Own client connection, as a separate process would have.
        p.client_store = dist.TCPStore(
            "127.0.0.1", port, None, False, timeout=store_timeout, wait_for_workers=False
        )
        p.backend = CountingC10dBackend(p.client_store, run_id)
        p.handler = DynamicRendezvousHandler.from_backend(
            run_id=run_id,
            store=p.client_store,
            backend=p.backend,
            min_nodes=n,
            max_nodes=n,
            timeout=timeouts,
        )
    except BaseException as exc:  # noqa: BLE001 - report everything
        p.error = f"setup: {type(exc).__name__}: {exc}"
        try:
            ready.abort()
        except Exception:
            pass
        return
    try:
        ready.wait(timeout=go_wait_s)
        if not go.wait(timeout=go_wait_s):
            p.error = "start signal never came"
            return
    except threading.BrokenBarrierError:
        p.error = "setup barrier broken (another participant failed)"
        return
    try:
        _store, rank, world_size = p.handler.next_rendezvous()
        p.t_end = time.perf_counter()
        p.rank = rank
        p.world_size = world_size
    except BaseException as exc:  # noqa: BLE001
        p.t_end = time.perf_counter()
        p.error = f"next_rendezvous: {type(exc).__name__}: {exc or '(no message)'}"


def stop_heartbeats(participants):
    for p in participants:
        h = p.handler
        if h is None:
            continue
        stop = getattr(h, "_stop_heartbeats", None)
        try:
            if stop is not None:
                stop()
        except Exception:
            pass


def one_run(run_index, n, join_s, last_call_s, setup_s):
    store_timeout = timedelta(seconds=join_s + 30)
    master = dist.TCPStore(
        "127.0.0.1", 0, None, True, timeout=store_timeout, wait_for_workers=False
    )
    port = master.port
    run_id = f"chorus-bench-{uuid.uuid4().hex[:12]}-{run_index}"
    timeouts = RendezvousTimeout(
        join=timedelta(seconds=join_s),
        last_call=timedelta(seconds=last_call_s),
        close=timedelta(seconds=10),
        heartbeat=timedelta(seconds=5),
    )

    participants = [Participant(i) for i in range(n)]
    ready = threading.Barrier(n + 1)
    go = threading.Event()
    threads = [
        threading.Thread(
            target=participant_main,
            args=(p, port, run_id, n, timeouts, store_timeout, ready, go, setup_s),
            name=f"rdzv-participant-{p.index}",
            daemon=True,
        )
        for p in participants
    ]
    for t in threads:
        t.start()

    try:
        ready.wait(timeout=setup_s)
    except threading.BrokenBarrierError:
        errs = [p.error for p in participants if p.error]
        go.set()
        raise RuntimeError(
            f"run {run_index}: setup failed or timed out after {setup_s}s"
            + (f": {errs[0]} ({len(errs)} participant(s) failed)" if errs else "")
        )

    t0 = time.perf_counter()
    go.set()

    # Bounded wait: the join timeout plus TorchElastic's 5 s rollback period
    # plus a margin.
    deadline = t0 + join_s + 5 + 20
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.perf_counter()))
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        raise RuntimeError(
            f"run {run_index}: {len(alive)} participant(s) still inside next_rendezvous() "
            f"{deadline - t0:.0f}s after start (e.g. {alive[0]}); giving up"
        )

    stop_heartbeats(participants)

    errors = [(p.index, p.error) for p in participants if p.error]
    if errors:
        idx, msg = errors[0]
        raise RuntimeError(
            f"run {run_index}: {len(errors)} participant(s) failed; participant {idx}: {msg}"
        )

    ranks = sorted(p.rank for p in participants)
    worlds = {p.world_size for p in participants}
    if ranks != list(range(n)) or worlds != {n}:
        raise RuntimeError(
            f"run {run_index}: bad result: ranks={ranks} world_sizes={sorted(worlds)} (expected "
            f"distinct ranks 0..{n - 1} and world size {n})"
        )

    ends = sorted(p.t_end - t0 for p in participants)
    info = {
        "seconds": ends[-1],
        "first_return_s": ends[0],
        "median_return_s": statistics.median(ends),
        "gets": sum(p.backend.gets for p in participants),
        "sets": sum(p.backend.sets for p in participants),
        "set_ok": sum(p.backend.set_ok for p in participants),
        "port": port,
        "run_id": run_id,
    }

    # Tear down in order: handlers, clients, then the master store.
    for p in participants:
        p.handler = None
        p.backend = None
        p.client_store = None
    del master
    return info


def main():
    ap = argparse.ArgumentParser(
        description="Time TorchElastic's DynamicRendezvousHandler (C10d backend, TCPStore) "
        "for N thread participants."
    )
    ap.add_argument("--participants", type=int, default=64, help="N (default 64)")
    ap.add_argument("--runs", type=int, default=3, help=f"repetitions, 1..{MAX_RUNS} (default 3)")
    ap.add_argument(
        "--join-timeout",
        type=float,
        default=120.0,
        help="rendezvous join timeout in seconds (default 120); also bounds each run",
    )
    ap.add_argument(
        "--last-call",
        type=float,
        default=1.0,
        help="last_call timeout in seconds (default 1; unused when min_nodes == max_nodes)",
    )
    ap.add_argument(
        "--setup-timeout",
        type=float,
        default=60.0,
        help="bound on creating the N client stores and handlers (default 60 s)",
    )
    ap.add_argument(
        "--cheap-method-name",
        action="store_true",
        help="diagnostic: replace dynamic_rendezvous.get_method_name (two inspect.stack() "
        "calls per internal event) with an equivalent sys._getframe() lookup",
    )
    args = ap.parse_args()

    n = args.participants
    if not 1 <= n <= MAX_PARTICIPANTS:
        ap.error(f"--participants must be in 1..{MAX_PARTICIPANTS}")
    if not 1 <= args.runs <= MAX_RUNS:
        ap.error(f"--runs must be in 1..{MAX_RUNS}")
    if args.join_timeout <= 0 or args.last_call <= 0 or args.setup_timeout <= 0:
        ap.error("timeouts must be positive")

    if args.cheap_method_name:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as _dr

        def _cheap_get_method_name(depth=2):
            # Same result as inspect.stack()[depth].function, without building
            # FrameInfo (and reading source) for every frame.
            try:
                return sys._getframe(depth).f_code.co_name
            except ValueError:
                return "no_method_name"

        _dr.get_method_name = _cheap_get_method_name

    print(
        f"torchelastic rendezvous peer: torch {torch.__version__}, Python "
        f"{sys.version.split()[0]}, {os.cpu_count()} CPUs, participants={n} (threads, one "
        f"client TCPStore each), runs={args.runs}, join_timeout={args.join_timeout:g}s, "
        f"last_call={args.last_call:g}s, PYTHONMALLOC={os.environ.get('PYTHONMALLOC')}, "
        f"get_method_name={'sys._getframe (patched)' if args.cheap_method_name else 'stock'}",
        flush=True,
    )
    if os.environ.get("PYTHONMALLOC") not in ("malloc", "malloc_debug"):
        print(
            "warning: PYTHONMALLOC is not malloc; torch 1.13's Store.compare_set allocates "
            "without the GIL and may crash this multi-threaded peer (see the docstring)",
            flush=True,
        )

    results = []
    try:
        for i in range(args.runs):
            info = one_run(i, n, args.join_timeout, args.last_call, args.setup_timeout)
            results.append(info["seconds"])
            print(
                f"run {i}: {info['seconds']:.3f} s until the last next_rendezvous() returned "
                f"(first {info['first_return_s']:.3f} s, median {info['median_return_s']:.3f} s); "
                f"ranks 0..{n - 1} distinct, world size {n}; store ops: gets={info['gets']} "
                f"sets={info['sets']} set_ok={info['set_ok']}; port {info['port']}",
                flush=True,
            )
    except Exception as exc:  # noqa: BLE001
        print(f"ERROR: {exc}", flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # Participant threads may still be blocked inside C++ store calls; do
        # not wait for them at interpreter shutdown.
        os._exit(1)

    median = statistics.median(results)
    print(f"median over {len(results)} run(s): {median:.3f} s", flush=True)
    summary = {
        "participants": n,
        "median_seconds": round(median, 4),
        "runs": [round(r, 4) for r in results],
        "store": "tcpstore",
        "handler": "DynamicRendezvousHandler/C10dRendezvousBackend",
    }
    if args.cheap_method_name:
        summary["get_method_name"] = "sys._getframe"
    print(json.dumps(summary), flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # Heartbeat timers are stopped, but exit without joining any leftover
    # daemon thread that might sit in a C++ store call.
    os._exit(0)


if __name__ == "__main__":
    main()
