r"""SurfaceFusion: the source embeddings fused into the decoder's output distribution.

Liu et al., "Understanding and Improving Encoder Layer Fusion in Sequence-to-Sequence
Learning", ICLR 2021 (arXiv 2012.14768). For each decoder position ``t``:

.. math::

    x_0   &= c \cdot E[\mathrm{src}]   \qquad \text{source token embeddings, no positions} \\
    e_t   &= W_O \, \mathrm{softmax}\big( (W_Q\,\mathrm{sg}(s_t)) (W_K\,\mathrm{sg}(x_L))^\top / \sqrt d \big)
             \, W_V x_0
             \qquad \text{one head, dropout on the weights} \\
    s_t   &\leftarrow s_t + \mathrm{FFN}(s_t), \quad e_t \leftarrow e_t + \mathrm{FFN}(e_t)
             \qquad \text{one shared ReLU FFN (``use_ffn``)} \\
    z_N   &= s_t E^\top, \qquad z_E = e_t E^\top \\
    \text{hard:}\ \log p &= \lambda \log\mathrm{softmax}(z_N) + (1-\lambda) \log\mathrm{softmax}(z_E)
             \qquad \lambda \text{ constant, or } \sigma(w \cdot [s_t; e_t] + b) \\
    \text{soft:}\ \log p &= \log\mathrm{softmax}\big(z_N + \log\mathrm{softmax}(\tau z_E)\big)

``sg`` is stop-gradient. Model families:

* ``s_t`` is the input of the model's tied ``lm_head``, so ``z_N`` is exactly the
  model's own logits (``final_logits_bias`` of BART/mBART/Marian included) plus
  ``FFN(s_t)·Eᵀ``. For T5 that input is the decoder output already scaled by
  ``d^-0.5`` (T5 scales it before its tied head); ``e_t`` is mapped through the same
  ``Eᵀ`` and so lives in that scaled space too.
* ``c`` (``source_scale``) defaults to ``sqrt(d)`` (the paper's Transformer, BART, mBART,
  Marian) and to ``1`` for the T5 family, whose encoder reads unscaled embeddings.
* The FFN's output layer starts at zero, so before training ``z_N`` equals the model's
  logits; a learned ``λ`` starts at the ``fusion_lambda`` value through its bias with a
  zero weight (never a saturated sigmoid, which would pass no gradient).

How (no model code copied): the encoder capture stores ``x_L`` and ``x_0`` (input ids
via a pre-hook on the encoder); pre-hooks on the decoder and on ``lm_head`` record the
decoder's ``encoder_hidden_states``/mask and ``s_t``; a forward hook on the top-level
model replaces ``logits`` by the fused log-probabilities and, when ``labels`` are given,
``loss`` by their negative log-likelihood (mean over labels ``!= -100``). ``generate()``
then decodes with them.

Beam search: transformers' beam search applies ``log_softmax`` to the logits it gets,
which would rank the beams of *hard* fusion (not normalised: ``logsumexp(log p) <= 0``)
by the renormalised distribution. While the adapter is attached, the model's
``generate`` is wrapped so that, whenever ``num_beams > 1``, a :class:`FusedBeamScores`
logits processor is appended to the caller's: it adds back each row's normaliser
``logsumexp(log p)`` recorded at the last forward, so the beam scores are exactly the
fused log-probabilities (plus the other processors' masks, e.g. ``-inf`` for
``min_new_tokens``; processors that rescale the scores, such as a repetition penalty, see
the renormalised values since they run before it). Greedy search needs no correction.
``unload()`` removes the wrapper with the hooks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers import LogitsProcessor, LogitsProcessorList

from ..config import LayerFusionConfig, invalid, require_number
from ..fusion import FusionContext, FusionModule
from ..hooks import BoundHook, Capture, ThreadState
from ..model import LayerFusionModel
from ..utils import WeakLink
from .hooks import (
    ENCODER_MASK_ARG,
    ENCODER_STATES_ARG,
    EncoderMemory,
    argument,
    find_seq2seq_parts,
)

FUSION_KINDS = ("hard", "soft")
UNSCALED_EMBEDDING_TYPES = ("t5", "mt5", "umt5", "longt5")  # encoders that read E[src] unscaled


@dataclass
class SurfaceFusionConfig(LayerFusionConfig):
    """Configuration of SurfaceFusion (encoder-decoder models with tied output embeddings).

    Args:
        fusion: ``"hard"`` (weighted sum of log-probabilities) or ``"soft"`` (logits plus
            the embedding distribution, renormalised).
        fusion_lambda: ``λ`` of hard fusion (the constant, or the initial value when learned).
        learn_lambda: Learn ``λ = σ(w·[s_t; e_t] + b)`` instead of a constant.
        temperature: ``τ`` of soft fusion.
        use_ffn: Apply the shared residual ReLU FFN to ``s_t`` and ``e_t``.
        ffn_dim: Hidden width of that FFN (default ``4 d``).
        attention_dropout: Dropout on the attention weights.
        source_scale: ``c`` in ``x_0 = c·E[src]``; ``None``: ``sqrt(d)``, or 1 for the T5 family.

    Example:
        >>> model = get_peft_model(bart, SurfaceFusionConfig(fusion="soft"))
        >>> model(input_ids=ids, labels=ids).loss.shape  # the loss of the fused distribution
        torch.Size([])
    """

    PEFT_TYPE: ClassVar[str] = "SURFACE_FUSION"

    fusion: str = field(
        default="hard", metadata={"help": "'hard' or 'soft' fusion of the two distributions."}
    )
    fusion_lambda: float = field(
        default=0.8,
        metadata={"help": "Hard fusion's lambda (weight of the decoder's distribution), in [0, 1]."},
    )
    learn_lambda: bool = field(
        default=False,
        metadata={"help": "Learn lambda = sigmoid(w·[s_t; e_t] + b), starting at `fusion_lambda`."},
    )
    temperature: float = field(default=1.0, metadata={"help": "Soft fusion's temperature tau (> 0)."})
    use_ffn: bool = field(default=True, metadata={"help": "Shared residual ReLU FFN on s_t and e_t."})
    ffn_dim: Optional[int] = field(default=None, metadata={"help": "Hidden width of the FFN (default 4·d)."})
    attention_dropout: float = field(
        default=0.1, metadata={"help": "Dropout on the attention weights, in [0, 1)."}
    )
    source_scale: Optional[float] = field(
        default=None,
        metadata={"help": "c in x0 = c·E[src]; None: sqrt(d), or 1 for the T5 family (unscaled embeddings)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fusion not in FUSION_KINDS:
            raise invalid("fusion", self.fusion, f"one of {FUSION_KINDS}")
        if not isinstance(self.learn_lambda, bool):
            raise invalid("learn_lambda", self.learn_lambda, "True or False")
        # a learned lambda starts at logit(fusion_lambda): 0 and 1 are out of reach
        ends = dict(low_open=self.learn_lambda, high_open=self.learn_lambda)
        require_number("fusion_lambda", self.fusion_lambda, low=0.0, high=1.0, **ends)
        require_number("temperature", self.temperature, low=0.0, low_open=True)
        if not isinstance(self.use_ffn, bool):
            raise invalid("use_ffn", self.use_ffn, "True or False")
        if self.ffn_dim is not None:
            require_number("ffn_dim", self.ffn_dim, low=1, integer=True)
        require_number("attention_dropout", self.attention_dropout, low=0.0, high=1.0, high_open=True)
        if self.source_scale is not None:
            require_number("source_scale", self.source_scale, low=0.0, low_open=True)


class SurfaceAttention(nn.Module):
    """One-head attention ``e_t`` from ``sg(s_t)`` over keys ``sg(x_L)`` and values ``x_0``."""

    def __init__(self, hidden_size: int, dropout: float) -> None:
        super().__init__()
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.output = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, s: torch.Tensor, x_last: torch.Tensor, x0: torch.Tensor, mask: Optional[torch.Tensor]
    ) -> torch.Tensor:
        q = self.query(s.detach())  # (batch, tgt, d)
        k = self.key(x_last.detach())  # (batch, src, d)
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])  # (batch, tgt, src)
        if mask is not None:
            scores = scores.masked_fill(mask[:, None, :] == 0, torch.finfo(scores.dtype).min)
        weights = self.dropout(torch.softmax(scores, dim=-1))
        return self.output(weights @ self.value(x0))  # (batch, tgt, d)


class SurfaceFusion(FusionModule):
    """Fused log-probabilities from the decoder state and the attended source embeddings.

    Parameters: ``attention.{query,key,value,output}``, ``ffn_up``/``ffn_down`` (when
    ``use_ffn``), ``lambda_gate`` (when ``learn_lambda``).
    """

    seq2seq = True

    def __init__(self, config: SurfaceFusionConfig, context: FusionContext) -> None:
        super().__init__(config, context)
        d = context.hidden_size
        self.check_supported(config, context)
        self.fusion, self.temperature = config.fusion, config.temperature
        model_type = getattr(getattr(context.model, "config", None), "model_type", None)
        default_scale = 1.0 if model_type in UNSCALED_EMBEDDING_TYPES else math.sqrt(d)
        self.source_scale = config.source_scale if config.source_scale is not None else default_scale
        self.attention = SurfaceAttention(d, config.attention_dropout)
        if config.use_ffn:
            ffn_dim = config.ffn_dim or 4 * d
            self.ffn_up = nn.Linear(d, ffn_dim)
            self.ffn_down = nn.Linear(ffn_dim, d)
            nn.init.zeros_(self.ffn_down.weight)
            nn.init.zeros_(self.ffn_down.bias)
        self.fusion_lambda = config.fusion_lambda
        if config.learn_lambda:
            self.lambda_gate = nn.Linear(2 * d, 1)
            nn.init.zeros_(self.lambda_gate.weight)
            nn.init.constant_(
                self.lambda_gate.bias, math.log(config.fusion_lambda / (1 - config.fusion_lambda))
            )
        self.memory = EncoderMemory()
        self._local = ThreadState()  # per thread: `_calls` and `last_normaliser`

    @property
    def _calls(self) -> dict[str, Any]:
        """This thread's record of the forward under way: source ids, decoder call, ``s_t``."""
        calls = getattr(self._local, "calls", None)
        if calls is None:
            calls = self._local.calls = {}
        return calls

    @_calls.setter
    def _calls(self, calls: dict[str, Any]) -> None:
        self._local.calls = calls

    @property
    def last_normaliser(self) -> Optional[torch.Tensor]:
        """``(batch,)`` logsumexp of the last fused row of this thread's last forward."""
        return getattr(self._local, "last_normaliser", None)

    @last_normaliser.setter
    def last_normaliser(self, value: Optional[torch.Tensor]) -> None:
        self._local.last_normaliser = value

    @classmethod
    def check_supported(cls, config: SurfaceFusionConfig, context: FusionContext) -> None:
        """An encoder-decoder model (raises otherwise) whose ``lm_head`` is tied to the input embeddings."""
        parts = find_seq2seq_parts(context.model)
        if parts.lm_head is None or parts.lm_head.weight is not parts.input_embeddings.weight:
            raise ValueError(
                "SurfaceFusion needs tied input and output embeddings (config.tie_word_embeddings=True): "
                f"{type(context.model).__name__} has an untied lm_head."
            )

    # -------------------------------------------------------------- encoder side
    def forward(self, states: list[torch.Tensor], capture: Capture) -> torch.Tensor:
        """Remember ``x_L`` and ``x_0`` for the decoder; return ``x_L`` unchanged."""
        source_ids = self._calls.pop("source_ids", None)
        if source_ids is None:
            raise RuntimeError(
                "SurfaceFusion needs the encoder to be called with `input_ids` (not inputs_embeds)."
            )
        self.memory.store(capture.states[-1], x0=self.source_embeddings(source_ids))
        return capture.states[-1]

    def source_embeddings(self, source_ids: torch.Tensor) -> torch.Tensor:
        """``x_0 = c·E[src]`` ``(batch, src, d)``."""
        weight = self._embedding_weight()
        return self.source_scale * F.embedding(source_ids, weight).to(self.attention.query.weight.dtype)

    # -------------------------------------------------------------- decoder side
    def fuse_logits(
        self,
        logits: torch.Tensor,
        s: torch.Tensor,
        x_last: torch.Tensor,
        x0: torch.Tensor,
        source_mask: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """Fused log-probabilities ``(batch, tgt, vocab)``.

        Args:
            logits: The model's logits ``s·Eᵀ (+ bias)`` ``(batch, tgt, vocab)``.
            s: The decoder state fed to ``lm_head`` ``(batch, tgt, d)``.
            x_last: The encoder output the decoder read ``(batch, src, d)``.
            x0: Source embeddings ``(batch, src, d)``.
            source_mask: ``(batch, src)``, 1 for real tokens, or ``None``.
        """
        weight = self._embedding_weight()  # (vocab, d)
        e = self.attention(s, x_last, x0, source_mask)  # (batch, tgt, d)
        z_n = logits
        if hasattr(self, "ffn_up"):
            s_ffn = self.ffn(s)
            s, e = s + s_ffn, e + self.ffn(e)
            z_n = logits + F.linear(s_ffn, weight)  # lm_head is linear: (s + f)·Eᵀ = s·Eᵀ + f·Eᵀ
        z_e = F.linear(e, weight)  # (batch, tgt, vocab)
        if self.fusion == "soft":
            return torch.log_softmax(z_n + torch.log_softmax(self.temperature * z_e, dim=-1), dim=-1)
        lam = self.lambda_of(s, e)
        return lam * torch.log_softmax(z_n, dim=-1) + (1 - lam) * torch.log_softmax(z_e, dim=-1)

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_down(torch.relu(self.ffn_up(x)))

    def lambda_of(self, s: torch.Tensor, e: torch.Tensor) -> torch.Tensor | float:
        """``λ``: the constant, or ``σ(w·[s; e] + b)`` ``(batch, tgt, 1)``."""
        if not hasattr(self, "lambda_gate"):
            return self.fusion_lambda
        return torch.sigmoid(self.lambda_gate(torch.cat([s, e], dim=-1)))

    def _embedding_weight(self) -> torch.Tensor:
        return self._weight_ref[0]

    def register_model_hooks(
        self, context: FusionContext, is_active: Callable[[], bool]
    ) -> list[RemovableHandle]:
        parts = find_seq2seq_parts(context.model)
        self._weight_ref = [parts.lm_head.weight]  # a list: not registered (and not saved) as ours
        encoder = context.located.container
        # BoundHooks (no closures, no bound methods): a deep copy of the model re-binds them, and
        # they hold this module weakly (see BoundHook)
        return [
            encoder.register_forward_pre_hook(BoundHook(self._keep_source), with_kwargs=True),
            parts.decoder.register_forward_pre_hook(BoundHook(self._keep_decoder_call), with_kwargs=True),
            parts.lm_head.register_forward_pre_hook(BoundHook(self._keep_state)),
            context.model.register_forward_hook(BoundHook(self._fuse_output, is_active), with_kwargs=True),
            wrap_generate(context.model, FusedBeamScores(self, is_active)),
        ]

    def _keep_source(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._calls["source_ids"] = argument(module, "input_ids", args, kwargs)

    def _keep_decoder_call(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._calls["decoder"] = (
            argument(module, ENCODER_STATES_ARG, args, kwargs),
            argument(module, ENCODER_MASK_ARG, args, kwargs),
        )

    def _keep_state(self, module: nn.Module, args: tuple) -> None:
        self._calls["s"] = args[0]

    def _fuse_output(
        self, is_active: Callable[[], bool], module: nn.Module, args: tuple, kwargs: dict, output: Any
    ) -> Any:
        calls, self._calls, self.last_normaliser = self._calls, {}, None
        if not is_active() or "s" not in calls or calls.get("decoder", (None,))[0] is None:
            return None
        return self._fused_output(output, calls, kwargs.get("labels"))

    def _fused_output(self, output: Any, calls: dict[str, Any], labels: Optional[torch.Tensor]) -> Any:
        if not hasattr(output, "logits"):
            raise TypeError("SurfaceFusion needs the model to return a ModelOutput (return_dict=True).")
        x_last, source_mask = calls["decoder"]
        x0 = self.memory.recall(x_last)["x0"]
        dtype = self.attention.query.weight.dtype
        logits = output.logits
        fused = self.fuse_logits(
            logits.to(dtype), calls["s"].to(dtype), x_last.to(dtype), x0, source_mask
        )  # (batch, tgt, vocab)
        output.logits = fused.to(logits.dtype)
        self.last_normaliser = fused[:, -1].detach().float().logsumexp(-1)  # (batch,)
        if labels is not None:
            labels = labels.to(fused.device)
            output.loss = F.nll_loss(fused.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return output


class FusedBeamScores(LogitsProcessor):
    """Beam-search processor: adds back the fused normaliser, so scores are the fused log-probabilities.

    Beam search hands processors ``log_softmax(logits)``; with ``logits = log p`` (fused) that is
    ``log p - logsumexp(log p)``, so adding the recorded ``logsumexp`` per row restores ``log p``.

    Args:
        fusion: The SurfaceFusion module whose normaliser is added back.
        is_active: True while that module's adapter is the active, enabled fusion adapter; any
            other time (another adapter active, this one disabled or deleted) the scores pass as
            they are, whatever normaliser the module kept from an earlier forward.

    Example:
        >>> model = get_peft_model(bart, SurfaceFusionConfig())
        >>> beams = model.generate(ids, num_beams=4, max_new_tokens=3)  # appended by the adapter
        >>> beams.shape[0]
        2
    """

    def __init__(self, fusion: SurfaceFusion, is_active: Callable[[], bool]) -> None:
        self.fusion, self.is_active = fusion, is_active

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        normaliser = self.fusion.last_normaliser  # None when the adapter was inactive at this step
        if normaliser is None or normaliser.shape[0] != scores.shape[0] or not self.is_active():
            return scores
        return scores + normaliser.to(scores.device, scores.dtype)[:, None]  # (rows, vocab)


class GenerateWrapper:
    """Handle of :func:`wrap_generate`: ``remove()`` takes its wrapper out of ``model.generate``.

    Several adapters wrap in turn (each wrapper calls the one below it); removing one, wherever it
    sits in that chain, links its neighbours, so a deleted adapter never stays inside ``generate``.
    The last removal restores the class's own ``generate``.
    """

    def __init__(self, model: nn.Module, wrapped: FusedGenerate) -> None:
        self.model, self.wrapped = WeakLink(model), wrapped  # weak: the adapter's layer keeps this handle

    def remove(self) -> None:
        if not self.model.alive:
            return  # the model is gone, and its generate with it
        model = self.model()
        outer, current = None, model.__dict__.get("generate")
        while isinstance(current, FusedGenerate) and current is not self.wrapped:
            outer, current = current, current.original
        if current is not self.wrapped:
            return  # already removed
        if outer is not None:
            outer.original = current.original
        elif current.original is not None:  # the wrapper below it, or a patch made before ours
            model.__dict__["generate"] = current.original
        else:  # the class's own generate again
            del model.__dict__["generate"]


def wrap_generate(model: nn.Module, processor: LogitsProcessor) -> GenerateWrapper:
    """Make ``model.generate`` append ``processor`` to the logits processors when ``num_beams > 1``.

    Args:
        model: A transformers model with ``generate`` (the instance is patched, not its class).
        processor: The processor to append.

    Example:
        >>> from transformers import LogitsProcessor
        >>> class Identity(LogitsProcessor):
        ...     def __call__(self, input_ids, scores):
        ...         return scores
        >>> handle = wrap_generate(bart, Identity())
        >>> "generate" in vars(bart)  # the instance's own generate
        True
        >>> handle.remove()  # bart.generate is the class's again
        >>> "generate" in vars(bart)
        False
    """
    generate = FusedGenerate(model, model.__dict__.get("generate"), processor)
    model.__dict__["generate"] = generate
    return GenerateWrapper(model, generate)


class FusedGenerate:
    """``generate`` with ``processor`` appended when ``num_beams > 1`` (see :func:`wrap_generate`).

    A callable object (not a closure): a deep copy of the model gets a wrapper around the copy's own
    ``generate`` and fusion. It holds the model through a weak link and looks the class's
    ``generate`` up when called: a bound method stored in the model would hold it in a cycle.

    Args:
        model: The model whose instance ``generate`` this becomes.
        original: What ``model.generate`` was before: the wrapper below this one (or another
            instance patch), or ``None``: the class's own ``generate``.
        processor: The processor to append.
    """

    def __init__(self, model: nn.Module, original: Callable | None, processor: LogitsProcessor) -> None:
        self.model, self.original, self.processor = WeakLink(model), original, processor

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self.model()
        config = kwargs.get("generation_config") or model.generation_config
        if (kwargs.get("num_beams") or config.num_beams or 1) > 1:
            kwargs["logits_processor"] = LogitsProcessorList(
                [*(kwargs.get("logits_processor") or []), self.processor]
            )
        if self.original is None:
            return type(model).generate(model, *args, **kwargs)
        return self.original(*args, **kwargs)


class SurfaceFusionModel(LayerFusionModel):
    """The PEFT tuner of ``SURFACE_FUSION``: ``get_peft_model(model, SurfaceFusionConfig())`` builds it."""

    prefix = "surface_fusion_"
    fusion_module_cls = SurfaceFusion
