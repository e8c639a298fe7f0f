"""Hook plumbing: capture every block's hidden state and replace the encoder output.

One :class:`BlockCapture` per model. It registers

* a forward pre-hook on the **container** that opens a capture for this forward,
* a forward pre-hook on **every block** that stores the block's input hidden state
  (the input of block ``i`` is ``z_i``: the embedding output for ``i = 0``, the output of
  block ``i`` otherwise) and, for the last block, its call arguments (in eval mode, only on the blocks
  whose inputs a fusion reads, and the last: see "Only the blocks read" below),
* a forward hook on the **container** that reads ``z_L`` from the container's output
  (exactly what a head would have seen), calls ``fuse`` and puts the result in place of
  the last hidden state, then closes the capture;
* for pre-norm stacks, a forward hook on the last block (its output is ``z_L``) and one on each
  norm module of the container: the norm that reads ``z_L`` is the final norm ``F``, and the
  capture is fused there instead, ``F`` running on the fused state (the rule in ``fusion.py``).

Under :func:`~.layer.fused_positions`, a forward without autograd graph keeps ``z_0 .. z_{L-1}``
only at the positions the fusion reads, gathered as each block is called (``select``): an evaluation
batch never holds every block's whole state at once.

Why inputs instead of outputs: the input of block ``i + 1`` is the tensor the model
really carries on (with its autograd history), also under re-entrant gradient
checkpointing where a block's own forward runs under ``no_grad``. Captures are stored by
index (never appended), so the re-run of a block during a checkpointed backward pass
(which happens outside any capture) is ignored, and nothing outlives the forward.

**Only the blocks read.** A hooked module leaves torch's fast call path, which costs about as much
again as the hook itself: on a deep decoder, where a decoding step is one token, the hooks of every
block are a visible part of the step. In eval mode (:meth:`BlockCapture.hook_blocks`) the capture hooks only
the blocks whose inputs the adapters read (``read``: their fused layers below ``L``) and the last block
(its call, and ``z_L`` before any final norm); the other states stay ``None``. R+n reads none, so it
hooks one block. A training forward hooks every block, as layer drop needs (a container that runs in
training mode while its capture is lean hooks them all before its blocks run).

Open captures live in a per-thread stack (:class:`ThreadState`): concurrent forwards of
one model in several threads, and a forward that calls the model again from inside a
hook, each fuse their own states. The hooks hold their capture as bound methods or
callable objects (never closures), so ``copy.deepcopy`` of a model re-binds them to the
copy. A container whose output is not the blocks' hidden state raises (naming
``blocks_path``) instead of fusing the wrong tensors.

Layer drop (wav2vec2, HuBERT, BART ``encoder_layerdrop``...): in training a block may be
skipped, and its output is then its input. A forward hook on every block (in training) keeps its output, so
the state of a skipped block is exact: ``z_i`` of a block that did not run is the output of the
last block before it that ran (or, when none before it ran, the input of the first one after it
that did). A container in eval mode that runs without all of its hooked blocks (the last one among them: an
early exit), or a training forward in which no block ran at all, raises instead.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .discovery import EncoderBlocks, LinkedBlocks
from .utils import WeakLink

_HIDDEN_KWARGS = ("hidden_states", "hidden_state", "x", "hidden")


@dataclass
class Capture:
    """What one forward of the encoder exposed to the fusion.

    Args:
        states: ``z_0 .. z_L``, each ``(batch, seq, d)``: the blocks' residual stream (for a
            pre-norm stack, ``z_L`` is the last block's output, before the final norm). In eval mode
            ``None`` for a block whose input no adapter reads (:meth:`BlockCapture.hook_blocks`).
        last_block_args: Positional arguments of the last block's call, hidden state
            first (re-used to run extra blocks of the same kind).
        last_block_kwargs: Keyword arguments of that call.
        final_norm: The stack's final norm ``F`` when it runs inside the container (pre-norm
            stacks; ``None`` otherwise): the fused state goes through it (the rule in ``fusion.py``).
        normed_last: ``F(z_L)`` as the model computed it (with ``final_norm``).
        selected: ``None``, or the flat ``(batch * seq)`` positions at which ``z_0 .. z_{L-1}`` were
            already gathered as the blocks ran (each then ``(1, selected, d)``; ``z_L`` stays whole):
            a no-grad forward under ``fused_positions`` keeps only what a token-wise module reads.
    """

    states: list[torch.Tensor]
    last_block_args: tuple
    last_block_kwargs: dict[str, Any]
    final_norm: nn.Module | None = None
    normed_last: torch.Tensor | None = None
    selected: torch.Tensor | None = None

    def call_like_last_block(self, block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """Run ``block`` on ``hidden`` with the arguments the last block received."""
        args, kwargs = _replace_hidden(self.last_block_args, self.last_block_kwargs, hidden)
        return first_tensor(block(*args, **kwargs))

    def apply_final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """``F(hidden)`` with the stack's final norm, in the norm's dtype (``hidden`` itself without one)."""
        if self.final_norm is None:
            return hidden
        dtype = next((p.dtype for p in self.final_norm.parameters()), hidden.dtype)
        return self.final_norm(hidden.to(dtype))

    def to(self, dtype: torch.dtype) -> Capture:
        """This capture with every floating tensor (states and last-block arguments) cast to ``dtype``.

        The arguments matter for modules that re-run blocks: a float attention mask or
        rotary table in the base model's dtype (bf16) cannot meet fp32 queries.

        Args:
            dtype: The floating dtype of the module that will consume the capture.

        Example:
            >>> capture = Capture([torch.zeros(1, 2, 4, dtype=torch.bfloat16)], (), {})
            >>> capture.to(torch.float32).states[0].dtype
            torch.float32
        """
        return replace(
            self,
            states=[None if s is None else s.to(dtype) for s in self.states],
            last_block_args=_cast_floats(self.last_block_args, dtype),
            last_block_kwargs=_cast_floats(self.last_block_kwargs, dtype),
            normed_last=None if self.normed_last is None else self.normed_last.to(dtype),
        )


def _cast_floats(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with floating tensors (also inside tuples, lists and dicts) cast to ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):  # keep namedtuples as they are
        return type(value)(_cast_floats(v, dtype) for v in value)
    if type(value) is dict:
        return {k: _cast_floats(v, dtype) for k, v in value.items()}
    return value


FuseFn = Callable[[Capture], "torch.Tensor | None"]
# the (batch, seq) positions the fusion will read, asked when a forward opens (None: every position)
SelectFn = Callable[[], "torch.Tensor | None"]


def first_tensor(output: Any) -> torch.Tensor:
    """The hidden state in a block or encoder output (tensor, tuple or ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    if isinstance(output, dict) and not hasattr(output, "to_tuple"):  # a plain dict (not a ModelOutput)
        raise TypeError(f"no hidden state in a dict output with keys {list(output)}")
    return output[0]


def _hidden_from_call(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    if args:
        return args[0]
    for key in _HIDDEN_KWARGS:
        if key in kwargs:
            return kwargs[key]
    raise RuntimeError(f"Cannot find the hidden state among the block's arguments {list(kwargs)}")


def _is_tensor(candidate: Any, tensor: torch.Tensor | None) -> bool:
    """Whether ``candidate`` is ``tensor`` (the same object, or the same storage, offset and shape)."""
    if tensor is None or not isinstance(candidate, torch.Tensor):
        return False
    if candidate is tensor:
        return True
    return (
        candidate.data_ptr() == tensor.data_ptr()
        and candidate.shape == tensor.shape
        and candidate.stride() == tensor.stride()
        and candidate.dtype == tensor.dtype
    )


def _replace_hidden(args: tuple, kwargs: dict[str, Any], hidden: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (hidden, *args[1:]), kwargs
    key = next(k for k in _HIDDEN_KWARGS if k in kwargs)
    return args, {**kwargs, key: hidden}


def _with_hidden(output: Any, hidden: torch.Tensor) -> Any:
    """``output`` (tensor, tuple or ModelOutput) with its last hidden state replaced.

    Where the output also carries all hidden states (a tuple ending with the last hidden
    state itself), that last entry is replaced too: some models (DeBERTa) feed their head
    from it instead of the last hidden state. Both the ``ModelOutput`` and the plain tuple
    (``return_dict=False``) forms are handled, so the head sees the fused state either way.
    """
    if isinstance(output, torch.Tensor):
        return hidden
    if hasattr(output, "last_hidden_state"):
        last = output.last_hidden_state
        output.last_hidden_state = hidden  # ModelOutput keeps dict and tuple views in sync
        states = getattr(output, "hidden_states", None)
        if _ends_with(states, last):
            output.hidden_states = (*states[:-1], hidden)
        return output
    last = output[0]
    return (hidden, *((*entry[:-1], hidden) if _ends_with(entry, last) else entry for entry in output[1:]))


def _ends_with(states: Any, last: torch.Tensor) -> bool:
    """Whether ``states`` is a tuple of hidden states whose last entry is ``last`` itself."""
    return isinstance(states, tuple) and bool(states) and states[-1] is last


class ThreadState:
    """Attributes private to each thread; a deep copy (or pickle) starts empty.

    Per-forward state of a module shared by several threads (a server running one model from
    several threads) lives here, so concurrent forwards never see each other's tensors. Copies
    of a model (``copy.deepcopy``, ``AveragedModel``) get a fresh, empty state of their own.

    The attributes live in a plain ``threading.local`` held inside, not in a subclass of it:
    ``torch.compile`` (dynamo, torch 2.13) drops every attribute set on a *subclass* of
    ``threading.local`` inside a compiled frame, so the counts the fusion's checks read
    (captures closed, forwards entered) would stay behind and a graph break after the block
    container would see a fusion that "did not run".

    Example:
        >>> state = ThreadState()
        >>> state.frames = []  # seen by this thread only
    """

    __slots__ = ("_per_thread",)

    def __init__(self) -> None:
        object.__setattr__(self, "_per_thread", threading.local())

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_per_thread"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_per_thread"), name, value)

    def __deepcopy__(self, memo: dict) -> ThreadState:
        return type(self)()

    def __reduce__(self) -> tuple:
        return (type(self), ())


@dataclass
class _Frame:
    """One open capture: the block inputs seen so far and the last block's call."""

    states: list[torch.Tensor | None]
    last_call: tuple[tuple, dict] = ((), {})
    runs: list[int] | None = None  # how often each block ran in this forward
    outputs: list[Any] | None = None  # each block's output (tensor, tuple...): states of dropped blocks
    last_output: torch.Tensor | None = None  # output of the last block that ran: z_L, before any norm
    fused: bool = False  # the final norm (pre-norm stacks) or an output projection already fused this capture
    projection: nn.Module | None = None  # the output projection that fused it (OPT's project_out)
    projected: torch.Tensor | None = None  # that projection's output: what the container must return
    mask: torch.Tensor | None = None  # (batch, seq): gather the block inputs there as they come
    selected: torch.Tensor | None = None  # (selected,) flat positions of ``mask``, found at z_0
    shape: torch.Size | None = None  # (batch, seq, d) of the block inputs (before any gathering)


class BoundHook:
    """A hook calling ``owner.method(*bound, *hook_args)``, holding its owner through a weak link.

    A bound method or a closure registered on a module of the model would keep its owner (a
    capture, a fusion module) alive from inside the model, while the owner holds the model's
    modules: a reference cycle, which only Python's cyclic collector frees. Through a
    :class:`~.utils.WeakLink` the hook keeps nothing alive and does nothing once its owner is
    freed; a deep copy of the model calls the copy's owner.

    Args:
        method: A bound method of the object that owns the hook.
        *bound: Leading arguments (e.g. a layer index).

    Example:
        >>> class Doubler(nn.Module):
        ...     def double(self, module, args, kwargs):
        ...         return (args[0] * 2,), kwargs
        >>> doubler, block = Doubler(), nn.Identity()
        >>> hook = BoundHook(doubler.double)  # holds ``doubler`` weakly
        >>> handle = block.register_forward_pre_hook(hook, with_kwargs=True)
        >>> block(torch.ones(2))
        tensor([2., 2.])
    """

    def __init__(self, method: Callable, *bound: Any) -> None:
        self.owner, self.name, self.bound = WeakLink(method.__self__), method.__name__, bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            owner = self.owner()
        except ReferenceError:  # the adapter part that registered it is gone
            return None
        return getattr(owner, self.name)(*self.bound, *args, **kwargs)


FORWARD_GUARD = "_layer_fusion_forward"  # the container's HookedForward (an instance attribute)


class HookedForward:
    """Makes ``container.forward(...)`` run the container's hooks, as ``container(...)`` does.

    Calling a module runs its forward pre-hooks, its ``forward`` and its forward hooks. Code that
    calls ``module.forward(...)`` itself skips the hooks: sentence-transformers does so on the model it
    wraps, which is the block container when a fusion adapter was loaded into a bare ``LlamaModel``
    through transformers' ``load_adapter``. The capture would then never open and the output would not
    be fused, without a word. So the container's ``forward`` becomes a :class:`ForwardThroughHooks`,
    and a call that did not come through the module's own call is sent through it.

    How a call is told apart: per thread, a stack with one entry per call of the module in progress.
    A forward pre-hook (run first) pushes an unclaimed entry, the forward claims the top entry, and an
    always-called forward hook pops it. A forward that finds no unclaimed entry on top was called
    directly. One guard serves every capture of the container (``users`` counts them); the last to
    leave restores the ``forward`` that was there before.

    Args:
        container: The module whose ``forward`` is guarded.

    Example:
        >>> container = nn.Linear(2, 2)
        >>> guard = HookedForward.attach(container)
        >>> seen = []
        >>> handle = container.register_forward_pre_hook(lambda module, args: seen.append("hook"))
        >>> _ = container.forward(torch.ones(1, 2))  # a direct call runs the hook too
        >>> seen
        ['hook']
        >>> HookedForward.detach(container); handle.remove()
        >>> "forward" in vars(container)  # the class's forward again
        False
    """

    def __init__(self, container: nn.Module) -> None:
        self.replaced = vars(container).get("forward")  # an instance forward set before us, or None
        self.users = 0
        self.detached = False
        self._local = ThreadState()
        self.handles = [
            container.register_forward_pre_hook(BoundHook(self._push), prepend=True),
            container.register_forward_hook(BoundHook(self._pop), always_call=True),
        ]

    @classmethod
    def attach(cls, container: nn.Module) -> HookedForward:
        """The container's guard (made and installed on first use); one more user of it."""
        guard = vars(container).get(FORWARD_GUARD)
        if guard is None:
            guard = cls(container)
            container.__dict__[FORWARD_GUARD] = guard
            container.forward = ForwardThroughHooks(container)
        guard.users += 1
        return guard

    @staticmethod
    def detach(container: nn.Module) -> None:
        """One user less; the last one removes the hooks and restores the container's ``forward``."""
        guard = vars(container).get(FORWARD_GUARD)
        if guard is None:
            return
        guard.users -= 1
        if guard.users > 0:
            return
        for handle in guard.handles:
            handle.remove()
        guard.detached = True  # a wrapper put around ours since (accelerate's) still calls it: pass through
        current = vars(container).get("forward")
        if isinstance(current, ForwardThroughHooks) and current.__self__ is container:
            del container.__dict__[FORWARD_GUARD]
            if guard.replaced is None:
                del container.__dict__["forward"]
            else:
                container.forward = guard.replaced

    def _stack(self) -> list[bool]:
        stack = getattr(self._local, "calls", None)
        if stack is None:
            stack = self._local.calls = []
        return stack

    def _push(self, module: nn.Module, args: tuple) -> None:
        self._stack().append(False)

    def _pop(self, module: nn.Module, args: tuple, output: Any) -> None:
        stack = self._stack()
        if stack:
            stack.pop()

    def claim(self) -> bool:
        """Whether this forward came through the module's call (whose hooks run); claims that call."""
        if self.detached:  # its hooks are gone: every call passes through
            return True
        stack = self._stack()
        if stack and not stack[-1]:
            stack[-1] = True
            return True
        return False

    def run_forward(self, container: nn.Module, args: tuple, kwargs: dict) -> Any:
        """Run the forward the guard stands in front of (the class's, unless one was set on the instance)."""
        if self.replaced is not None:
            return self.replaced(*args, **kwargs)
        return type(container).forward(container, *args, **kwargs)  # dynamo reads .__get__ as instance's


def _forward_through_hooks(container: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``container.forward`` while a capture hooks it: a direct call goes through ``container(...)``."""
    guard: HookedForward = container.__dict__[FORWARD_GUARD]
    if guard.claim():
        return guard.run_forward(container, args, kwargs)
    return container(*args, **kwargs)


class ForwardThroughHooks:
    """The guarded ``forward`` of a container, as a bound method of :func:`_forward_through_hooks`.

    It quacks as a bound method (``__func__``, ``__self__``), so code that wraps
    ``module.forward.__func__`` (accelerate's mixed precision) keeps working, but it holds its module
    through a :class:`~.utils.WeakLink`: a bound method stored on the module would put the model in a
    reference cycle. A deep copy of the model points at the copied container.

    Args:
        container: The module it is the ``forward`` of.
    """

    __slots__ = ("_container",)
    __func__ = staticmethod(_forward_through_hooks)

    def __init__(self, container: nn.Module) -> None:
        self._container = WeakLink(container)

    @property
    def __self__(self) -> nn.Module:
        return self._container()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _forward_through_hooks(self._container(), *args, **kwargs)


class BlockCapture:
    """Hooks that capture ``z_0 .. z_L`` and swap in ``fuse(capture)``.

    The open captures are kept per thread, as a stack: two threads running one model never
    mix their hidden states, and a forward that calls the model again (from a hook) gets a
    capture of its own, nested inside the outer one. Every hook is a :class:`BoundHook` and the
    blocks are held through weak links (:class:`~.discovery.LinkedBlocks`): the capture keeps no
    module of the model alive (the model's owner keeps the capture), and a deep copy of the model
    carries a working copy of it.

    **Only what is read.** With ``select``, a forward that builds no autograd graph, with the
    container in eval mode, keeps ``z_0 .. z_{L-1}`` only at the positions ``select()`` returns
    when the forward opens, gathered as each block is called (:attr:`Capture.selected`): each whole
    state is freed once the next block has read it, instead of all ``L + 1`` of them living until the
    fusion runs. The gathered rows are the ones :func:`select_positions` takes (the same bits).

    Args:
        located: Where the blocks and their container are (see ``discovery``).
        fuse: Called once per encoder forward with the :class:`Capture`; returns the new
            last hidden state, or ``None`` to leave the output untouched.
        blocks_path: How the blocks were named (the config's ``blocks_path``), for error messages.
        select: Returns the ``(batch, seq)`` bool mask of the positions the fusion will read, or
            ``None`` (every position; also where the fusion mixes positions).

    Example:
        >>> from peft_layerfusion.discovery import find_encoder_blocks
        >>> capture = BlockCapture(find_encoder_blocks(base_model), lambda c: c.states[-1] * 2)
        >>> count_hooks(base_model) > 0
        True
        >>> capture.remove()  # every hook gone (they also stop once ``capture`` is freed)
    """

    def __init__(
        self,
        located: EncoderBlocks,
        fuse: FuseFn,
        blocks_path: str | None = None,
        select: SelectFn | None = None,
    ) -> None:
        self._located = LinkedBlocks(located)
        self.fuse = fuse
        self.blocks_path = blocks_path
        self.select = select
        self._local = ThreadState()
        self.handles: list[RemovableHandle] = []  # on the container, its norms and projections
        self.block_handles: list[RemovableHandle] = []  # on the blocks of :attr:`hooked`
        self.read: frozenset[int] | None = None  # the block inputs a fusion reads (None: every one)
        self.lean = False  # eval mode: hook only the blocks read, and the last
        self.hooked: tuple[int, ...] = ()
        self._register()

    @property
    def located(self) -> EncoderBlocks:
        """The blocks and their container (``ReferenceError`` once the model was freed)."""
        return self._located()

    def _register(self) -> None:
        located = self.located
        container, add = located.container, self.handles.append
        add(container.register_forward_pre_hook(BoundHook(self._open_capture)))
        self._register_blocks()
        for norm in located.final_norms:
            add(norm.register_forward_hook(BoundHook(self._at_final_norm), with_kwargs=True))
        for projection in located.projections:
            add(projection.register_forward_pre_hook(BoundHook(self._at_projection), with_kwargs=True))
            add(projection.register_forward_hook(BoundHook(self._after_projection)))
        add(container.register_forward_hook(BoundHook(self._close_capture), always_call=True))
        HookedForward.attach(container)  # `container.forward(...)` runs these hooks too

    def hook_blocks(self, read: Iterable[int] | None, lean: bool) -> None:
        """Say which block inputs are read and whether to hook only those (re-hooks the blocks on a change).

        Args:
            read: Indices ``i < L`` of the block inputs ``z_i`` a fusion reads (``None``: every one).
            lean: ``True`` (eval mode): hook only the blocks in ``read`` and the last block; ``False``
                (training): every block, as layer drop needs.

        Example:
            >>> from peft_layerfusion.discovery import find_encoder_blocks
            >>> capture = BlockCapture(find_encoder_blocks(base_model), lambda c: None)
            >>> capture.hook_blocks(read=[], lean=True)  # what R+n reads, in eval mode
            >>> capture.hooked  # the last of 3 blocks
            (2,)
            >>> capture.remove()
        """
        self.read, self.lean = (None if read is None else frozenset(read)), lean
        if self.handles and self.hooked != self._blocks_to_hook():  # (no handles: removed)
            self._register_blocks()

    def _blocks_to_hook(self) -> tuple[int, ...]:
        num_blocks = self.located.num_blocks
        if not self.lean or self.read is None:
            return tuple(range(num_blocks))
        return tuple(sorted({i for i in self.read if i < num_blocks} | {num_blocks - 1}))

    def _register_blocks(self) -> None:
        """(Re-)register the hooks of the blocks :meth:`_blocks_to_hook` names."""
        for handle in self.block_handles:
            handle.remove()
        blocks, add = self.located.blocks, self.block_handles.append
        self.block_handles.clear()
        self.hooked = self._blocks_to_hook()
        for index in self.hooked:
            block = blocks[index]
            add(block.register_forward_pre_hook(BoundHook(self.record_input, index), with_kwargs=True))
            add(block.register_forward_hook(BoundHook(self.record_output, index)))

    # ------------------------------------------------------------- per-thread state
    def _frames(self) -> list[_Frame]:
        frames = getattr(self._local, "frames", None)
        if frames is None:
            frames = self._local.frames = []
        return frames

    @property
    def _open(self) -> list[torch.Tensor | None] | None:
        """The block inputs of the innermost capture open in this thread (``None``: none open)."""
        frames = self._frames()
        return frames[-1].states if frames else None

    @property
    def _last_call(self) -> tuple[tuple, dict]:
        frames = self._frames()
        return frames[-1].last_call if frames else ((), {})

    @property
    def closed_count(self) -> int:
        """How many captures this thread has closed (fused or not) so far."""
        return getattr(self._local, "closed", 0)

    # ------------------------------------------------------------- hooks
    def _open_capture(self, module: nn.Module, args: tuple) -> None:
        if module.training and self.lean:  # a training forward (layer drop) needs every block hooked
            self.hook_blocks(self.read, lean=False)
        num_blocks = self.located.num_blocks
        gather = self.select is not None and not torch.is_grad_enabled() and not module.training
        self._frames().append(
            _Frame(
                states=[None] * (num_blocks + 1),
                runs=[0] * num_blocks,
                outputs=[None] * num_blocks,
                mask=self.select() if gather else None,
            )
        )

    def record_input(self, index: int, block: nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook of block ``index`` (bound by :class:`BoundHook`): keep its input hidden state."""
        frames = self._frames()
        if not frames:  # a checkpointed re-run during backward, outside any forward
            return
        frame = frames[-1]
        hidden = _hidden_from_call(args, kwargs)  # z_index: (batch, seq, d)
        frame.shape = frame.shape or hidden.shape
        if frame.mask is not None:  # only the read positions: (1, selected, d)
            if frame.selected is None:
                frame.selected = position_index(frame.mask, hidden)
            hidden = gather_positions(hidden, frame.selected)
        frame.states[index] = hidden
        frame.runs[index] += 1
        frame.last_call = (args, kwargs)  # the last block's call, or the last that ran when it was dropped

    def record_output(self, index: int, block: nn.Module, args: tuple, output: Any) -> None:
        """Forward hook of block ``index``: keep its output (the next state, if the next block is dropped).

        The latest output is also ``z_L`` of the residual stream, before any final norm: blocks run in
        order, so after the last block that ran it is the state the final norm reads.
        """
        frames = self._frames()
        if frames:
            if frames[-1].mask is None:  # gathering: an eval forward, where a dropped block raises
                frames[-1].outputs[index] = output
            frames[-1].last_output = first_tensor(output)

    def _at_final_norm(self, norm: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        """Forward hook of a norm inside the container: if it read ``z_L``, it is the final norm ``F``.

        The capture is fused here: the fusion replaces ``z_L`` and ``F`` runs on its result (the
        placement rule in ``fusion.py``), which becomes the norm's output, what the rest of the
        container and the head read. (A final norm outside the container, as in ViT on
        transformers 4.x, needs nothing: it runs on the container's fused output by itself.)
        """
        frame = self._frames()[-1] if self._frames() else None
        if frame is None or frame.fused or not _is_tensor(_hidden_from_call(args, kwargs), frame.last_output):
            return None
        frame.fused = True  # before fusing: the fusion calls F again (on other tensors)
        states = self._checked_states(frame, norm.training)
        states[-1] = frame.last_output
        capture = Capture(
            states, *frame.last_call, final_norm=norm, normed_last=output, selected=frame.selected
        )
        return self.fuse(capture)

    def _at_projection(self, projection: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """Forward pre-hook of an output projection (OPT's ``project_out``): if it reads ``z_L`` itself
        (no final norm before it), the capture is fused here and the projection runs on the fused state,
        as the model runs it on ``z_L``; the container then returns the projection's output."""
        frame = self._frames()[-1] if self._frames() else None
        if frame is None or frame.fused or not _is_tensor(_hidden_from_call(args, kwargs), frame.last_output):
            return None
        frame.fused, frame.projection = True, projection
        states = self._checked_states(frame, projection.training)
        states[-1] = frame.last_output
        fused = self.fuse(Capture(states, *frame.last_call, selected=frame.selected))
        return None if fused is None else _replace_hidden(args, kwargs, fused)

    def _after_projection(self, projection: nn.Module, args: tuple, output: Any) -> None:
        """Forward hook of an output projection: keep the output of the one that fused."""
        frame = self._frames()[-1] if self._frames() else None
        if frame is not None and frame.projection is projection:
            frame.projected = output

    def _close_capture(self, module: nn.Module, args: tuple, output: Any) -> Any:
        frames = self._frames()
        if not frames:
            return None
        frame = frames.pop()
        self._local.closed = self.closed_count + 1
        if output is not None and frame.projection is not None:
            self._check_projected(output, frame)
        if output is None or frame.fused:  # the forward raised, or the final norm fused already
            return None
        states = self._checked_states(frame, module.training)
        states[-1] = self._encoder_output(output, frame.shape)
        if frame.last_output is not None and not _is_tensor(states[-1], frame.last_output):
            self._warn_unknown_transform()
        fused = self.fuse(Capture(states, *frame.last_call, selected=frame.selected))
        return None if fused is None else _with_hidden(output, fused)

    def _check_projected(self, output: Any, frame: _Frame) -> None:
        """Raise unless the container returns the output of the projection that fused (its last step)."""
        try:
            last = first_tensor(output)
        except (KeyError, IndexError, TypeError):
            last = None
        if not _is_tensor(last, frame.projected):
            raise RuntimeError(
                f"Layer fusion: the container of {self._where()} fused at the input of its output projection "
                f"`{type(frame.projection).__name__}`, but does not return that projection's output, so the "
                "fused state may not reach the head. Set `blocks_path` to a block list whose container ends "
                "with its last block, final norm or output projection."
            )

    def _warn_unknown_transform(self) -> None:
        """Warn (once per capture) that the container changed ``z_L`` with no norm module seen doing it."""
        if getattr(self, "_warned_transform", False):
            return
        self._warned_transform = True
        warnings.warn(
            f"Layer fusion: the container of {self._where()} returns something else than its last block's "
            "output, and no norm module inside it read that output (a functional final norm?): the fused "
            "state replaces the container's output, so z_L and the other states may be on different scales. "
            "See the placement rule in peft_layerfusion/fusion.py.",
            UserWarning,
            stacklevel=2,
        )

    def _checked_states(self, frame: _Frame, training: bool) -> list[torch.Tensor | None]:
        """The frame's states, after checking every block ran (warning if one ran several times).

        In training, blocks skipped by layer drop get their state filled in (:meth:`_fill_dropped`);
        in eval mode a block that did not run is an error.
        """
        missing = [i for i in self.hooked if frame.states[i] is None]
        if missing:
            if not training or len(missing) == len(self.hooked):
                raise self._not_run_error(missing, training)
            self._fill_dropped(frame, missing)
        if any(runs > 1 for runs in frame.runs):
            warn_shared_blocks(self.located, self.blocks_path, frame.runs)
        return frame.states

    def _where(self) -> str:
        path = f"blocks_path={self.blocks_path!r}" if self.blocks_path else "the discovered blocks"
        return f"{path} (block list `{self.located.blocks_name}`, container `{self.located.container_name}`)"

    @staticmethod
    def _fill_dropped(frame: _Frame, missing: list[int]) -> None:
        """The states of blocks skipped by layer drop (a skipped block's output is its input).

        ``z_i`` of a skipped block ``i`` is the output of the last block before it that ran, or,
        when none before it ran, the input of the first block after it that ran.
        """
        states, outputs = frame.states, frame.outputs
        ran = [i for i in range(len(outputs)) if i not in missing]
        for i in missing:
            before = [j for j in ran if j < i]
            states[i] = first_tensor(outputs[before[-1]]) if before else states[min(j for j in ran if j > i)]

    def _not_run_error(self, missing: list[int], training: bool) -> RuntimeError:
        if training:  # layer drop skipped every block: no state of this forward is known
            return RuntimeError(
                f"Layer fusion: layer drop skipped every block of {self._where()} in this training step "
                "(probability layerdrop ** num_blocks), so no block state is known to fuse. Lower the "
                "model's layer drop (config.layerdrop / encoder_layerdrop) or use more blocks."
            )
        return RuntimeError(
            f"Layer fusion: the container ran but blocks {missing} of {self._where()} did not run in this "
            "eval-mode forward (early exit, or a block list that is not the encoder's): the fused states "
            "would be wrong. Set `blocks_path` to the encoder's list of blocks."
        )

    def _encoder_output(self, output: Any, block_shape: torch.Size) -> torch.Tensor:
        """``z_L`` from the container's output, checked against the shape of the blocks' inputs."""
        try:
            last = first_tensor(output)
        except (KeyError, IndexError, TypeError) as error:
            last = error
        if not isinstance(last, torch.Tensor) or last.shape != block_shape:
            got = tuple(last.shape) if isinstance(last, torch.Tensor) else type(output).__name__
            raise RuntimeError(
                f"Layer fusion: the output of the container of {self._where()} is not the encoder's hidden "
                f"state: got {got}, the blocks run on {tuple(block_shape)}. The container must be the "
                "module that runs the blocks and returns their last hidden state (not the model with its "
                "head): set `blocks_path` to the encoder's block list."
            )
        return last

    @property
    def num_hooks(self) -> int:
        return len(self.handles) + len(self.block_handles)

    def remove(self) -> None:
        """Remove every hook this capture registered."""
        if self.handles and self._located.container.alive:
            HookedForward.detach(self.located.container)
        for handle in (*self.handles, *self.block_handles):
            handle.remove()
        self.handles.clear()
        self.block_handles.clear()


def warn_shared_blocks(
    located: EncoderBlocks, blocks_path: str | None, runs: list[int] | None = None
) -> None:
    """Warn that the blocks of ``located`` share weights (or that one block ran several times).

    Args:
        located: The blocks found.
        blocks_path: The config's ``blocks_path`` (named in the message).
        runs: How often each block ran in one forward, when known.

    Example:
        >>> import warnings
        >>> from peft_layerfusion.discovery import find_encoder_blocks
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_shared_blocks(find_encoder_blocks(base_model), None, [2, 2, 2])
        >>> print(caught[0].message)
        Layer fusion: the blocks `bert.encoder.layer` (blocks_path=None) share ...
    """
    seen = f" (runs per forward: {runs})" if runs else ""
    warnings.warn(
        f"Layer fusion: the blocks `{located.blocks_name}` (blocks_path={blocks_path!r}) share "
        f"weights{seen}, as in ALBERT: one module runs several times per forward, so the fusion sees "
        "only its last call's input, not one state per layer. Layer fusion needs one module per layer.",
        UserWarning,
        stacklevel=3,
    )


def count_hooks(model: nn.Module, package: str | None = "peft_layerfusion") -> int:
    """Number of forward and forward-pre hooks in ``model`` whose function comes from ``package``.

    transformers registers hooks of its own (e.g. to record ``output_hidden_states``), so by
    default only the hooks defined by this package are counted: after ``unload()`` there
    must be none.

    Args:
        model: Any module; every submodule is inspected.
        package: Count hooks whose function is defined in this package (or a submodule of
            it); ``None`` counts every hook.

    Example:
        >>> unloaded = model.unload()  # a PeftModel with a fusion adapter
        >>> count_hooks(unloaded)
        0
    """

    def counted(hook: Callable) -> bool:
        if package is None:
            return True
        owner = getattr(hook, "__module__", None) or getattr(getattr(hook, "func", None), "__module__", "")
        return owner == package or owner.startswith(package + ".")

    return sum(
        counted(hook)
        for m in model.modules()
        for hook in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())
    )


# ------------------------------------------------------------------ positions
# Token-wise modules may run on the selected positions only (``layer.fused_positions``).


def position_index(mask: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """Flat ``(batch * seq)`` indices of the selected positions of ``last`` ``(batch, seq, d)``.

    Found once per forward and used by both :func:`select_positions` and :func:`scatter_positions`.
    """
    if tuple(mask.shape) != tuple(last.shape[:2]):
        raise ValueError(
            f"fused_positions mask has shape {tuple(mask.shape)}, the encoder states "
            f"{tuple(last.shape[:2])} (batch, seq): pass the mask of this batch"
        )
    return mask.to(last.device).flatten().nonzero().squeeze(1)  # (selected,)


def gather_positions(state: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``state`` ``(batch, seq, d)`` at the flat positions ``index``: ``(1, selected, d)``.

    Gathered with ``index_select`` (faster than boolean indexing, which searches the mask again per
    state).
    """
    return state.flatten(0, 1).index_select(0, index).unsqueeze(0)


def select_positions(capture: Capture, index: torch.Tensor) -> Capture:
    """``capture`` with each state (and ``F(z_L)``) reduced to the positions ``index``: ``(1, selected, d)``
    (the states the capture gathered as the blocks ran, :attr:`Capture.selected`, are taken as they are)."""
    gathered = len(capture.states) - 1 if capture.selected is not None else 0  # z_0 .. z_{L-1}
    if gathered and not torch.equal(capture.selected, index):
        raise RuntimeError("the capture gathered other positions than the fusion reads")
    rest = [None if s is None else gather_positions(s, index) for s in capture.states[gathered:]]
    states = capture.states[:gathered] + rest
    normed = None if capture.normed_last is None else gather_positions(capture.normed_last, index)
    return replace(capture, states=states, normed_last=normed, selected=index)  # each state (1, selected, d)


def scatter_positions(fused: torch.Tensor, last: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``z_L`` with the positions ``index`` replaced by ``fused`` ``(1, selected, d)``."""
    out = last.flatten(0, 1).index_copy(0, index, fused.squeeze(0).to(last.dtype))  # (batch * seq, d)
    return out.view_as(last)
