"""Chorus for PyTorch scripts.

A script run as a Chorus `program` job imports this package to get what the
built-in trainer gets (docs/python.md):

    import chorus, torch.distributed as dist
    chorus.init_process_group()          # or dist.init_process_group("chorus")
    model = torch.nn.parallel.DistributedDataParallel(net)
    for step in range(start, steps):
        with chorus.phase("FORWARD"):
            loss = loss_fn(model(x), y)
        ...
        chorus.step(step, loss=loss.item(), samples=len(x))

- The "chorus" backend runs torch.distributed's collectives on the job's
  communicator: the coordinator sees every collective of every rank and
  names a rank that never joined one (`chorus status`).
- step() and phase() give `chorus status`, `chorus top`, the job's page and
  /metrics the script's step, phase and throughput.
- save_checkpoint() / load_checkpoint() go through the coordinator's
  checkpoint store: listed by `chorus checkpoints`, resumed with
  `--resume_from`, exported with `chorus export`.
- Elastic jobs re-form in process: reform_requested(),
  join_next_generation() and share_newest_state().

Everything here needs the environment Chorus gives a program job; outside
one, session() raises chorus.Error naming the missing variable.
"""

import atexit
import concurrent.futures
import contextlib
import pickle
import threading

import torch
import torch.distributed as dist

from chorus import _C

Error = _C.Error

__all__ = [
    "Error", "MembershipLost", "Aborted", "DeadlineExceeded", "typed_error", "typed_errors",
    "session", "init_process_group", "rank", "world_size", "local_rank",
    "generation", "job_id", "device", "resuming", "step", "set_epoch", "phase",
    "checkpoint_requested", "save_checkpoint", "wait_for_checkpoints", "load_checkpoint",
    "membership_lost", "reform_requested", "join_next_generation", "share_newest_state",
    "flatten_state", "unflatten_state", "state_from_checkpoint",
]

_lock = threading.Lock()
_session = None
_uploads = None

# The name under which a checkpoint or a shared state carries the structure
# (dicts, lists, numbers) that its tensors were taken out of.
STRUCTURE = "chorus.structure"
_TENSOR = "chorus.tensor"


def session():
    """This rank's Chorus session, joined on first use (every rank of the
    generation must get here: it connects the communicator)."""
    global _session
    with _lock:
        if _session is None:
            _session = _C.Session.from_environment()
        return _session


def _at_exit():
    # The last record (step, loss, phase FINISHED) reaches Chorus before the
    # process ends, and started checkpoint uploads finish.
    with _lock:
        s, uploads = _session, _uploads
    if uploads is not None:
        uploads.shutdown(wait=True)
    if s is not None:
        s.enter_phase("FINISHED")
        s.flush_progress()


atexit.register(_at_exit)


def _create_process_group(store, rank, world_size, timeout):
    # torch.distributed's store and timeout are not used: the communicator
    # meets its peers through the coordinator, and its op timeout is the
    # job spec's.
    del store, timeout
    return session().process_group(rank, world_size)


dist.Backend.register_backend("chorus", _create_process_group)


def init_process_group():
    """Makes the "chorus" process group torch.distributed's default group,
    with this rank's rank and world size; returns the session."""
    s = session()
    dist.init_process_group("chorus", store=s.torch_store(), rank=s.rank,
                            world_size=s.world_size)
    return s


def rank():
    return session().rank


def world_size():
    return session().world_size


def local_rank():
    return session().local_rank


def generation():
    return session().generation


def job_id():
    return session().job_id


def device():
    """Where this rank's tensors go: its GPU in a CUDA job, else the CPU."""
    return torch.device(session().device)


def resuming():
    """Whether the job was submitted with --resume_from."""
    return session().resuming


def step(n, loss=0.0, samples=0):
    """Step `n` ended with `loss` over `samples` samples of this rank."""
    if isinstance(loss, torch.Tensor):
        loss = loss.item()
    session().step(int(n), float(loss), int(samples))


def set_epoch(epoch):
    session().set_epoch(int(epoch))


@contextlib.contextmanager
def phase(name):
    """Marks a phase of the step (SETUP, DATA, FORWARD, BACKWARD, OPTIMIZER,
    COLLECTIVE, CHECKPOINT, EVAL) for as long as the block runs."""
    s = session()
    previous = s.enter_phase(name)
    try:
        yield
    finally:
        s.enter_phase(previous)


def checkpoint_requested():
    """True once after each `chorus checkpoint` of the job."""
    return session().checkpoint_requested()


def flatten_state(state, prefix=""):
    """(tensors, structure): the tensors of a nested state (dicts, lists and
    tuples of tensors and plain values, as state_dict()s are) by dotted path,
    and the structure with each tensor replaced by a reference to its name."""
    tensors = []

    def walk(value, path):
        if isinstance(value, torch.Tensor):
            tensors.append((path, value))
            return (_TENSOR, path, list(value.shape), str(value.dtype))
        if isinstance(value, dict):
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [walk(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return value

    structure = walk(state, prefix)
    names = [n for n, _ in tensors]
    if len(set(names)) != len(names):
        seen = set()
        twice = next(n for n in names if n in seen or seen.add(n))
        raise ValueError(f"two tensors of the state are both named '{twice}' "
                         "(a key that contains '.'); rename one")
    if STRUCTURE in names:
        raise ValueError(f"'{STRUCTURE}' is reserved; rename that entry of the state")
    return tensors, structure


def unflatten_state(structure, tensors_by_name):
    """The nested state: `structure` with every tensor reference replaced by
    the tensor of that name."""
    def walk(value):
        if isinstance(value, tuple) and len(value) == 4 and value[0] == _TENSOR:
            return tensors_by_name[value[1]]
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, tuple):
            return tuple(walk(v) for v in value)
        return value
    return walk(structure)


def _encode(structure, device="cpu"):
    data = pickle.dumps(structure, protocol=pickle.HIGHEST_PROTOCOL)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)


def _decode(tensor):
    return pickle.loads(tensor.cpu().numpy().tobytes())


def save_checkpoint(step_, state, wait=False):
    """Stores `state` (a tensor, a state_dict, or a dict of them and plain
    values) as checkpoint `step_` of the job, through the coordinator.

    Rank 0 stores (every rank may call it: the others return at once). The
    training loop waits only for a copy of the tensors; the upload and
    commit run in the background, one checkpoint at a time. Returns a
    concurrent.futures.Future that raises chorus.Error if the upload failed;
    wait=True waits for the commit."""
    s = session()
    global _uploads
    with _lock:
        if _uploads is None:
            _uploads = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="chorus-checkpoint")
    if s.rank != 0:
        done = concurrent.futures.Future()
        done.set_result(None)
        return done
    tensors, structure = flatten_state(state)
    with phase("CHECKPOINT"):
        copies = [(n, t.detach().to("cpu", copy=True)) for n, t in tensors]
    copies.append((STRUCTURE, _encode(structure)))
    upload = _uploads.submit(s.store_checkpoint_copy, int(step_), copies)
    if wait:
        upload.result()
    return upload


def wait_for_checkpoints():
    """Waits for every checkpoint save_checkpoint started (raises the first
    failure)."""
    with _lock:
        uploads = _uploads
    if uploads is not None:
        uploads.submit(lambda: None).result()


def load_checkpoint():
    """(step, state) of the checkpoint the job resumes from (--resume_from),
    with the state as it was given to save_checkpoint (tensors on the CPU),
    or None when the job starts fresh. Restore with load_state_dict()."""
    s = session()
    if not s.resuming:
        return None
    saved_step, tensors = s.load_checkpoint()
    return saved_step, state_from_checkpoint(dict(tensors))


def state_from_checkpoint(tensors_by_name):
    """The state save_checkpoint was given, from the checkpoint's tensors by
    name: what torch.load returns for the model.pt of `chorus export`. A
    checkpoint of the C++ SDK (no structure) comes back as it is."""
    by_name = dict(tensors_by_name)
    structure = by_name.pop(STRUCTURE, None)
    if structure is None:
        return by_name
    return unflatten_state(_decode(structure), by_name)


# ---- Errors (docs/python.md "Errors").

def _code_of(text):
    """The status code a Chorus message starts with ("UNAVAILABLE: ..."),
    or "UNKNOWN"."""
    head, sep, _ = str(text).partition(":")
    return head if sep and head.isupper() and head.replace("_", "").isalpha() else "UNKNOWN"


# Every chorus.Error says its status code: error.code == "UNAVAILABLE".
Error.code = property(lambda self: _code_of(self))


class MembershipLost(Error):
    """A peer of this generation was lost (UNAVAILABLE): call
    join_next_generation(error)."""


class Aborted(Error):
    """The coordinator ended this generation to form another (ABORTED):
    call join_next_generation(error)."""


class DeadlineExceeded(Error):
    """A collective outlasted the job's op timeout (DEADLINE_EXCEEDED); the
    generation cannot go on: call join_next_generation(error)."""


_TYPED = {"UNAVAILABLE": MembershipLost, "ABORTED": Aborted, "DEADLINE_EXCEEDED": DeadlineExceeded}


def typed_error(error):
    """The chorus.Error subclass instance for a failed collective's exception
    (torch.distributed raises them as RuntimeError "CODE: message"), or None
    when `error` is not one of Chorus's."""
    if isinstance(error, tuple(_TYPED.values())):
        return error
    if not isinstance(error, RuntimeError):
        return None
    text = str(error)
    code = _code_of(text)
    if code not in _TYPED:  # wrapped: "... failed: UNAVAILABLE: ..."
        code = next((c for c in _TYPED if f"{c}: " in text), code)
    kind = _TYPED.get(code)
    if kind is None:
        return error if isinstance(error, Error) else None
    return kind(text if text.startswith(code) else f"{code}: {text}")


@contextlib.contextmanager
def typed_errors():
    """Inside it, a collective that fails raises chorus.MembershipLost,
    chorus.Aborted or chorus.DeadlineExceeded (with the original as its
    __cause__) instead of torch.distributed's plain RuntimeError:

        with chorus.typed_errors():
            loss.backward()          # DDP's all-reduce
    """
    try:
        yield
    except RuntimeError as error:
        typed = typed_error(error)
        if typed is None or typed is error:
            raise
        raise typed from error


# ---- Elastic jobs (docs/python.md "Elastic scripts").

def membership_lost(error):
    """Whether a collective's exception means the generation is gone: a peer
    was lost (UNAVAILABLE), the coordinator formed a new generation
    (ABORTED), or an op timed out (DEADLINE_EXCEEDED). Then call
    join_next_generation()."""
    return isinstance(typed_error(error), (MembershipLost, Aborted, DeadlineExceeded))


def reform_requested():
    """Call at the start of every step, on every rank (one 8-byte
    all-reduce): True when the coordinator planned a change (a drain, a
    growth) and every rank must call join_next_generation() now."""
    return session().reform_requested()


def join_next_generation(error=None):
    """Leaves the current generation (`error`: the failure that ended it;
    None for a planned change), joins the next and makes its process group
    torch.distributed's default. True: joined (rank(), world_size() and
    generation() are the new ones; rebuild DistributedDataParallel, then
    call share_newest_state). False: this rank is not part of it; exit 0."""
    s = session()
    if dist.is_initialized():
        dist.destroy_process_group()
    joined = s.join_next_generation("" if error is None else str(error))
    if joined:
        init_process_group()
    return joined


def share_newest_state(held_step, state):
    """Every member ends with the newest state any member holds.

    `held_step` is the step of the state this rank holds (-1 for a newcomer
    that holds none). Returns (step, state): the step that was shared (-1
    when nobody held any) and the state, with the structure and values of
    the lowest rank holding the newest step. Tensors of this rank's `state`
    with the same name, shape and dtype are updated in place (so a survivor's
    model needs no reload); the rest are new, on this rank's device: pass
    them to load_state_dict()."""
    s = session()
    here = device()
    tensors, structure = flatten_state(state) if held_step >= 0 else ([], None)
    blob = _encode(structure, here) if held_step >= 0 else torch.empty(0, dtype=torch.uint8)
    # 1: the newest holder's structure, its length first.
    length = torch.tensor([blob.numel()], dtype=torch.int64, device=here)
    shared_step, _, _ = s.share_newest_state(held_step, [("structure.length", length)])
    if shared_step < 0:
        return -1, state
    received = torch.zeros(int(length.item()), dtype=torch.uint8, device=here)
    if blob.numel() == received.numel() and held_step == shared_step:
        received.copy_(blob)
    s.share_newest_state(held_step, [("structure", received)])
    newest = _decode(received)
    # 2: the tensors, into this rank's own where they fit.
    own = dict(tensors)
    into = []

    def slot(value):
        if isinstance(value, tuple) and len(value) == 4 and value[0] == _TENSOR:
            _, name, shape, dtype = value
            dtype = getattr(torch, dtype.split(".")[-1])
            mine = own.get(name)
            if (mine is None or list(mine.shape) != shape or mine.dtype != dtype
                    or not mine.is_contiguous()):
                mine = torch.empty(shape, dtype=dtype, device=here)
            into.append((name, mine))
        elif isinstance(value, dict):
            for v in value.values():
                slot(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                slot(v)

    slot(newest)
    with torch.no_grad():
        s.share_newest_state(held_step, into)
    return shared_step, unflatten_state(newest, dict(into))
