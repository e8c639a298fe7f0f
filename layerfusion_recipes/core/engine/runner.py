"""Forward passes of a task's model, through the feature cache or not, at one LR or ``K`` at once.

A :class:`Runner` turns encoded examples into logits: it pads them (:func:`collate`), replays the
feature cache when it has one (every encoder block returns its cached output), and runs token-wise
fusion modules only at the positions the task reads (:func:`~peft_layerfusion.fused_positions`: the
labelled first sub-words of NER, the pooled position of a sentence classifier). Same numbers there,
a fraction of the fusion work.

A :class:`StackedRunner` runs ``K`` parameter sets at once. On the feature-cache path the frozen
encoder costs nothing per step and the trainable part (fusion module + head) of a few-shot run is
small: a step is mostly fixed per-call overhead (embeddings, hooks, padding, Python), not arithmetic.
So the ``K`` LR candidates of a cell share one forward: each candidate has its own copy of the
trainable parameters, and ``torch.func.vmap`` over :func:`torch.func.functional_call` runs the model
once with the parameters stacked along a new leading dimension. Everything that does not depend on
them (embeddings, replayed block outputs, position selection) is computed once, unbatched; the fusion
module and the head run batched.

Each candidate is the run it would be alone: same initial parameters (copies of one built model),
same batches, same dropout masks (``randomness="same"`` draws one mask per call, exactly as a lone
run does, since the draws depend only on the seed and the shapes). Evaluation runs the candidates in
groups bounded by a byte budget (:meth:`StackedRunner.evaluation_group_size`): its working set is
one group's, not ``K`` candidates'.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from peft_layerfusion.discovery import hidden_size_of
from peft_layerfusion.layer import active_fusion_module, fused_positions
from peft_layerfusion.optim import mixing_multipliers
from peft_layerfusion.utils import eval_mode

from ..batches import IGNORE_INDEX, collate
from ..memory import release_freed_memory, resident_above
from ..models.models import trainable_parameters
from .loop import restore
from .processes import process_state

# bytes a no-grad forward of stacked candidates is budgeted at (StackedRunner.evaluation_group_size)
EVALUATION_BYTES = 2**27

# the model inputs an encoded example may carry (token types: sentence pairs on BERT-like encoders)
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class Scorer(Protocol):
    """The scores of predictions on one split (built once per split).

    ``metrics`` names what :meth:`scores` returns, the first one choosing the best dev epoch;
    :meth:`scores` takes ``(K, labelled)`` predicted label ids (:func:`predict_labelled` of ``K``
    candidates) and returns one ``{metric: score in 0..1}`` per candidate.
    """

    metrics: tuple[str, ...]

    def scores(self, predicted: torch.Tensor) -> list[dict[str, float]]: ...


Positions = Callable[[dict[str, torch.Tensor]], torch.Tensor]  # collated batch -> (batch, seq) bool


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of a collated batch the model reads (:data:`MODEL_INPUTS` it has)."""
    return {key: batch[key] for key in MODEL_INPUTS if key in batch}


def reads_block_calls(model: nn.Module) -> bool:
    """Whether ``model``'s fusion module reads the last block's call arguments (R+n's extra blocks run
    with them): a replay of the feature cache must then give the last block a real forward's call.

    Example:
        >>> from peft_layerfusion import ExtraLayersConfig
        >>> r_plus_n = get_peft_model(base_model, ExtraLayersConfig(modules_to_save=["classifier"]))
        >>> reads_block_calls(model), reads_block_calls(r_plus_n)  # DWAtt, R+n
        (False, True)
    """
    module = active_fusion_module(model)
    return module is not None and module.reads_block_calls


def labelled_positions(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The positions a token-level loss reads: ``labels != -100`` ``(batch, seq)``."""
    return batch["labels"] != IGNORE_INDEX


class Runner:
    """Forward passes of a model, through a feature cache or not.

    Args:
        model: The model (already wrapped by its regime).
        located: Its encoder blocks (needed with ``cache``).
        cache: A feature cache of the same frozen encoder, or ``None``.
        positions: The ``(batch, seq)`` positions the task reads, from a collated batch (token-wise
            fusion runs there only); ``None``: everywhere.
        pad_id: Token id that pads ``input_ids`` (the model's own: a decoder's head finds the last
            real token by it).

    Example:
        >>> from layerfusion_recipes.core.results.cells import Cell
        >>> model, located = experiment.build(Cell("dwatt", "fe", 2, 2, 0))  # DWAtt + head, tiny BERT
        >>> runner = Runner(model, located, cache, positions=labelled_positions)  # cache: dev, test filled
        >>> logits, labels = runner.logits(experiment.dev[:4], torch.device("cpu"))
        >>> logits.shape, labels.shape  # (batch, seq, C), (batch, seq)
        (torch.Size([4, 6, 5]), torch.Size([4, 6]))
        >>> runner.fused_count, int((labels != -100).sum())  # DWAtt ran at the 14 labelled of 24 only
        (14, 14)
    """

    def __init__(
        self,
        model: nn.Module,
        located=None,
        cache=None,
        positions: Positions | None = None,
        pad_id: int = 0,
    ) -> None:
        self.model, self.located, self.cache = model, located, cache
        self.positions, self.pad_id = positions, pad_id
        self.fused_count = 0  # positions the fusion ran on in the last forward

    def plain(self) -> Runner:
        """A one-parameter-set runner over the same model, cache and positions."""
        return Runner(self.model, self.located, self.cache, self.positions, self.pad_id)

    def logits(self, features: Sequence[dict], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's logits and the labels of a list of features (collated, on ``device``)."""
        batch = {k: v.to(device) for k, v in collate(features, self.pad_id).items()}
        replay = (
            self.cache.replay(self.located, self.cache.batch(features), self.replays_block_calls)
            if self.cache
            else nullcontext()
        )
        mask = self.positions(batch) if self.positions is not None else None
        self.fused_count = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        with replay, fused_positions(self.model, mask) if mask is not None else nullcontext():
            logits = self.forward(batch)
        return logits, batch["labels"]

    @functools.cached_property
    def replays_block_calls(self) -> bool:
        """Whether a replay gives the last block a real forward's call (:func:`reads_block_calls`): only
        where the fusion module reads it, as a block that computes what the next ones read then runs."""
        return reads_block_calls(self.model)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model's logits of a collated batch (replay already set up)."""
        return self.model(**model_inputs(batch)).logits

    # What the one training loop (core.engine.fitting.fit) asks of a runner: its candidates' parameters,
    # their loss and their scores. One candidate here; a StackedRunner trains K together.
    def candidate_parameters(self) -> list[list[nn.Parameter]]:
        """The trainable parameters of each candidate (one: the model's), before the optimizer exists."""
        return [trainable_parameters(self.model)]

    def lr_scales(self) -> list[float]:
        """The LR multiplier of each of a candidate's parameters (in :meth:`candidate_parameters`'
        order): the fusion's ``mixing_lr_multiplier`` for its mixing parameters, 1 for the rest."""
        multipliers = mixing_multipliers(self.model)
        return [multipliers.get(id(p), 1.0) for p in trainable_parameters(self.model)]

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of ``(..., labels)`` logits where ``labels`` ``(...)`` is not -100 (every
        labelled token of NER, every sentence of a classifier)."""
        return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE_INDEX)

    def scores(self, scorer: Scorer, predicted: torch.Tensor) -> list[dict[str, float]]:
        """The scores of the one candidate's predictions ``(labelled,)`` (:func:`predict_labelled`)."""
        return scorer.scores(predicted.unsqueeze(0))


class StackedRunner(Runner):
    """A :class:`Runner` whose forward runs ``K`` parameter sets at once: logits get a leading
    candidate dimension ``(K, ...)``.

    Args:
        model: The model (already wrapped by its regime); its trainable parameters give the
            names and the initial values of every candidate.
        count: ``K``, the number of candidates.
        located, cache, positions, pad_id: As :class:`Runner`.

    In evaluation (no grad, eval mode) the candidates run in groups sized to
    :data:`EVALUATION_BYTES` (:meth:`evaluation_group_size`): the same logits bitwise, one group's
    working set at a time instead of ``K``'s.

    Example:
        >>> from layerfusion_recipes.core.results.cells import Cell
        >>> model, located = experiment.build(Cell("dwatt", "fe", 2, 2, 0))  # DWAtt + head, tiny BERT
        >>> runner = StackedRunner(model, 4, located, cache, positions=labelled_positions)
        >>> logits, labels = runner.logits(experiment.dev[:4], torch.device("cpu"))
        >>> logits.shape  # (4 candidates, batch, seq, C)
        torch.Size([4, 4, 6, 5])
        >>> alone, _ = runner.plain().logits(experiment.dev[:4], torch.device("cpu"))  # one parameter set
        >>> torch.allclose(logits[3], alone, atol=1e-6)  # every candidate starts as the built model
        True
    """

    def __init__(self, model: nn.Module, count: int, located=None, cache=None, **options) -> None:
        super().__init__(model, located, cache, **options)
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.names = [name for name, _ in named]
        # {name: (K, *shape)}: every candidate's values of a parameter, in one tensor
        self.stacks = {name: p.detach().unsqueeze(0).repeat(count, *[1] * p.dim()) for name, p in named}
        self.candidates = candidate_leaves(self.stacks)
        self.groups_run = 0  # candidate groups the last forward ran (1 in training)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = model_inputs(batch)

        def one(parameters: dict[str, torch.Tensor]) -> torch.Tensor:
            return functional_call(self.model, parameters, (), inputs).logits

        evaluating = not torch.is_grad_enabled() and not self.model.training  # no dropout draws to share
        size = self.evaluation_group_size() if evaluating else len(self.candidates)
        groups = candidate_groups(len(self.candidates), size)
        self.groups_run = len(groups)
        logits = [vmap(one, randomness="same")(self.stacked(group)) for group in groups]
        return logits[0] if len(logits) == 1 else torch.cat(logits)  # (K, batch, ..., labels)

    def stacked(self, group: range) -> dict[str, torch.Tensor]:
        """The parameters of the candidates ``group``, stacked: ``{name: (len(group), *shape)}``, views
        of :attr:`stacks` (no copy), through which each candidate's parameters get their gradients."""
        part = slice(group.start, group.stop)
        return {
            name: StackedView.apply(self.stacks[name][part], *[self.candidates[k][i] for k in group])
            for i, name in enumerate(self.names)
        }

    @functools.cached_property
    def position_bytes(self) -> int:
        """What one candidate's forward holds at a fused position, in float32: ``states_held`` vectors
        of width ``d`` for the fusion module that declares it (Average, ScalarMix: 2), every state
        (``z_0 .. z_L``) for the others (a bound: Concat's and DWAtt's working sets grow with the
        states), one for the plain head (the head's input). Read on first use: a runner that never
        forwards needs no width."""
        module = active_fusion_module(self.model)
        if module is None:
            held = 1
        elif module.states_held is not None:
            held = module.states_held
        else:
            held = self.located.num_blocks + 1 if self.located is not None else 1
        return held * hidden_size_of(self.model, self.located) * 4

    def evaluation_group_size(self) -> int:
        """Candidates one no-grad forward runs together: as many as :data:`EVALUATION_BYTES` holds at
        ``fused positions x`` :attr:`position_bytes` each (at least one, at most ``K``).

        Why: a candidate's evaluation working set grows with the positions its fusion runs on (DWAtt's
        value MLPs at every labelled position of a 64-sentence batch: about 90 MB per candidate at
        13 states x 768 on CoNLL-2003's longest test batch, 3,203 positions), and ``K`` of them ran at
        once. Groups of candidates give the same numbers bitwise (each candidate's matrix products
        keep their shapes; only the leading batch of the stacked ones shrinks), where splitting a
        batch's sentences would not (a matrix product's sums can change with its number of rows).
        """
        per_candidate = max(1, self.fused_count) * self.position_bytes
        return max(1, min(len(self.candidates), EVALUATION_BYTES // per_candidate))

    def to(self, device: torch.device) -> None:
        """Move the model and every candidate's parameters to ``device`` (before building an optimizer)."""
        self.model.to(device)
        self.stacks = {name: stack.to(device) for name, stack in self.stacks.items()}
        self.candidates = candidate_leaves(self.stacks)

    def candidate_parameters(self) -> list[list[torch.Tensor]]:
        """Every candidate's parameters, moved to this process's device (before the optimizer holds them)."""
        self.to(process_state().device)
        return self.candidates

    def lr_scales(self) -> list[float]:
        """As :meth:`Runner.lr_scales`, in the order of :attr:`names` (each candidate's parameters)."""
        multipliers = mixing_multipliers(self.model)
        named = dict(self.model.named_parameters())
        return [multipliers.get(id(named[name]), 1.0) if name in named else 1.0 for name in self.names]

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The candidates' losses of ``(K, ..., labels)`` logits, summed: each candidate gets its own
        gradient."""
        return torch.stack([Runner.loss(self, candidate, labels) for candidate in logits]).sum()

    def scores(self, scorer: Scorer, predicted: torch.Tensor) -> list[dict[str, float]]:
        """Every candidate's scores from ``(K, labelled)`` predictions, in one batched call."""
        return scorer.scores(predicted)

    def load_candidate(self, index: int) -> None:
        """Copy candidate ``index``'s parameters into the model (e.g. to inspect it alone)."""
        named = dict(self.model.named_parameters())
        restore([named[name] for name in self.names], self.candidates[index])


def candidate_leaves(stacks: dict[str, torch.Tensor]) -> list[list[torch.Tensor]]:
    """Each candidate's parameters as leaf tensors that share the memory of ``stacks`` (``{name: (K,
    *shape)}``): ``[[name's k-th row for each name] for each k]``. The optimizer updates them in place,
    hence the stacks; :class:`StackedView` hands them their gradients.

    Example:
        >>> [[w0], [w1]] = candidate_leaves({"weight": torch.zeros(2, 3)})
        >>> w0.is_leaf, w0.shape
        (True, torch.Size([3]))
    """
    count = len(next(iter(stacks.values()))) if stacks else 0
    return [[stack[k].detach().requires_grad_(True) for stack in stacks.values()] for k in range(count)]


class StackedView(torch.autograd.Function):
    """``torch.stack(leaves)`` without the copy: ``stack`` (``(K, *shape)``), whose rows ``leaves``
    already share (:func:`candidate_leaves`), returned as the forward's input, and its gradient handed
    back to each leaf row by row, as ``torch.stack``'s backward does (the same numbers bitwise).

    Why: the copy was a fifth of a step's training state (4 of 24 B per trainable parameter of each
    candidate: 0.22 GB for seven DWAtt candidates at 13 states x 768) and a copy per step.

    Example:
        >>> stacks = {"weight": torch.zeros(2, 3)}
        >>> view = StackedView.apply(stacks["weight"], *[c[0] for c in candidate_leaves(stacks)])
    """

    @staticmethod
    def forward(ctx, stack: torch.Tensor, *leaves: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return stack.view_as(stack)  # (K, *shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # noqa: ARG004
        return (None, *grad.unbind(0))  # one (*shape) gradient per leaf


def candidate_groups(count: int, size: int) -> list[range]:
    """``range(count)`` in consecutive groups of ``size`` (the last one shorter).

    Example:
        >>> candidate_groups(7, 3)
        [range(0, 3), range(3, 6), range(6, 7)]
    """
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


def labelled_predictions(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Predicted label ids where there is a label, row after row: ``(..., *labels.shape, C)`` logits
    give ``(..., labelled)``: one per labelled token of NER, one per sentence of a classifier.

    Example:
        >>> labelled_predictions(torch.randn(4, 2, 8, 3), labels).shape  # 4 candidates, 14 labelled
        torch.Size([4, 14])
    """
    return logits.argmax(-1)[..., labels != IGNORE_INDEX]


def padded_tokens(features: Sequence[dict]) -> int:
    """Tokens of ``features`` padded to the longest: ``batch x seq``, what a forward's tensors scale with."""
    return len(features) * max(len(feature["input_ids"]) for feature in features)


def largest_first(features: Sequence[dict], batch_size: int) -> list[slice]:
    """The evaluation batches of ``features`` (consecutive runs of ``batch_size``), the one with the most
    padded tokens first (:func:`padded_tokens`; ties in order).

    Why: the glibc heap keeps what a batch frees and reuses it only for requests that fit in it. Batches
    in growing order (the recipes sort their evaluation sets by length) each need larger blocks than
    the last one freed, so the heap grew by the sum of their working sets (1.2 GB for one test pass of
    seven stacked DWAtt candidates on CoNLL-2003's 3,453 sentences, 0.6 GB of states). Largest first,
    the first batch's blocks serve every later one: the heap holds one batch's working set. The
    batches (hence every prediction) are the same, only their order changes.

    Example:
        >>> largest_first([{"input_ids": [1] * n} for n in (2, 3, 9, 4)], 2)
        [slice(2, 4, None), slice(0, 2, None)]
    """
    batches = [slice(start, start + batch_size) for start in range(0, len(features), batch_size)]
    return sorted(batches, key=lambda batch: -padded_tokens(features[batch]))


@torch.no_grad()
def predict_labelled(
    runner: Runner,
    features: Sequence[dict],
    batch_size: int,
    device: torch.device,
    release_above: int | None = None,
) -> torch.Tensor:
    """Label ids ``runner`` predicts at the labelled places of ``features`` (eval mode during the
    call), example after example: ``(labelled,)``, or ``(K, labelled)`` for a stacked runner.

    The batches run largest first (:func:`largest_first`: the process's memory then holds one
    batch's working set, not the sum of them, each smaller batch reusing what the one before freed),
    the heap's freed pages are given back at the end
    (:func:`~layerfusion_recipes.core.memory.release_freed_memory`), and after each batch that leaves
    the process above ``release_above`` resident bytes
    (:func:`~layerfusion_recipes.core.memory.resident_above`:
    ``0`` after every batch; the 13 x 768 FE sweep in passes of one candidate: RSS rose by 0.45 GB
    over each test evaluation without it), and their predictions are put back in order.

    Example:
        >>> from layerfusion_recipes.core.results.cells import Cell
        >>> model, located = experiment.build(Cell("none", "fe", 2, 2, 0))  # the plain head, tiny BERT
        >>> runner = Runner(model, located, cache, positions=labelled_positions)
        >>> predicted = predict_labelled(runner, experiment.dev, 64, torch.device("cpu"))
        >>> predicted.shape  # a label id per word of the 12 dev sentences
        torch.Size([70])
    """
    predicted: dict[int, torch.Tensor] = {}  # batch start -> (..., batch labelled)
    with eval_mode(runner.model):
        for batch in largest_first(features, batch_size):
            logits, labels = runner.logits(features[batch], device)
            predicted[batch.start] = labelled_predictions(logits, labels)
            if resident_above(release_above):  # what the batch freed (its states, one block at a time)
                release_freed_memory()
    release_freed_memory()
    return torch.cat([predicted[start] for start in sorted(predicted)], dim=-1)


@torch.no_grad()
def depth_attention_profile(runner: Runner, features: list[dict], batch_size: int = 64) -> list[float]:
    """DWAtt's depth-attention weights ``a_n`` averaged over the positions the task reads.

    Returns one weight per fused layer (they sum to 1).

    Example:
        >>> from layerfusion_recipes.core.results.cells import Cell
        >>> model, located = experiment.build(Cell("dwatt", "fe", 2, 2, 0))  # DWAtt + head, tiny BERT
        >>> runner = Runner(model, located, cache, positions=labelled_positions)
        >>> profile = depth_attention_profile(runner, experiment.dev)  # e.g. [0.35, 0.31, 0.34]
        >>> len(profile), round(sum(profile), 6)  # one weight per fused block
        (3, 1.0)
    """
    module = active_fusion_module(runner.model)
    seen: list[torch.Tensor] = []
    handle = module.register_forward_pre_hook(lambda m, args: seen.append(args[1]))  # its Capture
    total, count = None, 0
    device = next(runner.model.parameters()).device  # the device its run trained it on
    with eval_mode(runner.model):
        try:
            for start in range(0, len(features), batch_size):
                runner.logits(features[start : start + batch_size], device)
                # the runner fuses the read positions only: the module saw exactly those
                weights = module.capture_attention(seen.pop())  # (read positions, K)
                if weights.shape[0] != runner.fused_count:
                    raise RuntimeError("depth attention was not computed on the read positions only")
                summed = weights.sum(0)  # (K,)
                total = summed if total is None else total + summed
                count += weights.shape[0]
        finally:
            handle.remove()
    return (total / max(count, 1)).tolist()
