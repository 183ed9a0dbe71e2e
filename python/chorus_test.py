"""Tests of the Python half of the chorus package (python/chorus), run with
pytest against the package as python/install.sh lays it out
(tests/python_package_test.sh). What needs a job (a session, collectives) is
covered by the end-to-end tests; this is what a script relies on besides."""

import os

import pytest
import torch

import chorus


def test_flatten_names_every_tensor_by_its_path_and_unflatten_puts_them_back():
    state = {
        "model": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.zeros(3)},
        "optimizer": {"state": {0: {"momentum": torch.ones(2)}}, "param_groups": [{"lr": 0.1}]},
        "history": [torch.tensor([1, 2]), (torch.tensor(3.5), "note")],
        "step": 7,
    }
    tensors, structure = chorus.flatten_state(state)
    names = [name for name, _ in tensors]
    assert names == ["model.w", "model.b", "optimizer.state.0.momentum", "history.0",
                     "history.1.0"]
    back = chorus.unflatten_state(structure, dict(tensors))
    assert back["step"] == 7
    assert back["optimizer"]["param_groups"] == [{"lr": 0.1}]
    assert isinstance(back["history"][1], tuple) and back["history"][1][1] == "note"
    assert torch.equal(back["model"]["w"], state["model"]["w"])
    assert back["history"][1][0] is state["history"][1][0]


def test_flatten_refuses_two_tensors_with_one_name_and_the_reserved_one():
    with pytest.raises(ValueError, match="both named 'a.b'"):
        chorus.flatten_state({"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}})
    with pytest.raises(ValueError, match="'chorus.structure' is reserved"):
        chorus.flatten_state({"chorus": {"structure": torch.ones(1)}})


def test_a_checkpoints_tensors_come_back_as_the_state_that_was_saved():
    state = {"model": {"w": torch.full((2, 2), 3.0)}, "epoch": 4}
    tensors, structure = chorus.flatten_state(state)
    saved = dict(tensors)
    saved[chorus.STRUCTURE] = chorus._encode(structure)
    restored = chorus.state_from_checkpoint(saved)
    assert restored["epoch"] == 4
    assert torch.equal(restored["model"]["w"], state["model"]["w"])
    # A checkpoint of the C++ SDK carries no structure: its tensors by name.
    plain = {"fc.weight": torch.ones(2)}
    assert chorus.state_from_checkpoint(plain).keys() == {"fc.weight"}


@pytest.mark.parametrize("text, kind, code", [
    ("UNAVAILABLE: op #12 (allreduce/sum float32[4] torch:all_reduce) on rank 1/2 failed",
     chorus.MembershipLost, "UNAVAILABLE"),
    ("ABORTED: communicator aborted: generation 3 formed", chorus.Aborted, "ABORTED"),
    ("DEADLINE_EXCEEDED: op #5 exceeded the op timeout of 5m", chorus.DeadlineExceeded,
     "DEADLINE_EXCEEDED"),
    # DDP's reducer wraps the backend's message.
    ("Error in the DDP reducer: UNAVAILABLE: a peer is gone", chorus.MembershipLost,
     "UNAVAILABLE"),
])
def test_a_failed_collectives_error_is_typed_by_its_code(text, kind, code):
    typed = chorus.typed_error(RuntimeError(text))
    assert isinstance(typed, kind)
    assert isinstance(typed, chorus.Error) and isinstance(typed, RuntimeError)
    assert typed.code == code
    assert str(typed).startswith(code + ": ")
    assert chorus.membership_lost(RuntimeError(text))


def test_other_errors_are_left_as_they_are():
    assert chorus.typed_error(RuntimeError("CUDA out of memory")) is None
    assert chorus.typed_error(ValueError("UNAVAILABLE: not a collective's")) is None
    assert not chorus.membership_lost(RuntimeError("INVALID_ARGUMENT: bad tensor"))
    assert not chorus.membership_lost(KeyError("x"))


def test_typed_errors_raises_the_typed_error_with_the_original_as_its_cause():
    original = RuntimeError("ABORTED: communicator aborted: the generation ended")
    with pytest.raises(chorus.Aborted) as raised:
        with chorus.typed_errors():
            raise original
    assert raised.value.__cause__ is original
    assert str(raised.value) == str(original)
    with pytest.raises(RuntimeError, match="^CUDA out of memory$"):
        with chorus.typed_errors():
            raise RuntimeError("CUDA out of memory")
    with pytest.raises(ZeroDivisionError):
        with chorus.typed_errors():
            1 / 0


def test_outside_a_job_the_session_names_what_is_missing(monkeypatch):
    for name in list(os.environ):
        if name.startswith("CHORUS_"):
            monkeypatch.delenv(name)
    with pytest.raises(chorus.Error) as raised:
        chorus._C.Session.from_environment(1.0)
    assert "CHORUS_" in str(raised.value)
    assert raised.value.code == str(raised.value).split(":")[0]
    assert raised.value.code.isupper()
