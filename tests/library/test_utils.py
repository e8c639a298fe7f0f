"""``peft_layerfusion.utils.WeakLink`` and the hooks built on it (``hooks.BoundHook``)."""

from __future__ import annotations

import copy
import gc
import pickle

import pytest
import torch
from torch import nn

from peft_layerfusion.hooks import BoundHook
from peft_layerfusion.utils import WeakLink


class Holder(nn.Module):
    """A module holding a weak link to its own child (what a fusion layer does with its blocks)."""

    def __init__(self) -> None:
        super().__init__()
        self.child = nn.Linear(2, 2)
        self.link = WeakLink(self.child)


def test_a_link_does_not_keep_its_target_alive():
    target = nn.Linear(2, 2)
    link = WeakLink(target)
    assert link() is target and link.alive
    del target
    assert not link.alive
    with pytest.raises(ReferenceError, match="was freed"):
        link()


def test_a_deep_copy_links_to_the_copy_of_its_target():
    holder = Holder()
    copied = copy.deepcopy(holder)
    assert copied.link() is copied.child
    assert copied.child is not holder.child
    assert holder.link() is holder.child


def test_a_pickled_link_is_loaded_linked_to_the_loaded_target():
    loaded = pickle.loads(pickle.dumps(Holder()))
    assert loaded.link() is loaded.child
    assert torch.equal(loaded.link().weight, loaded.child.weight)


class Counter:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def record(self, *args) -> str:
        self.calls.append(args)
        return "called"


def test_a_bound_hook_calls_its_owner_and_does_nothing_once_the_owner_is_freed():
    owner = Counter()
    hook = BoundHook(owner.record, 3)
    assert hook("module", "args") == "called"
    assert owner.calls == [(3, "module", "args")]
    del owner
    gc.collect()
    assert hook("module", "args") is None  # inert: it neither raises nor keeps the owner alive
