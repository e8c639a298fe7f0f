"""Feature cache for the frozen-encoder (FE) regime.

In FE every pretrained weight is frozen and (with the encoder in eval mode) the block outputs
``z_0 .. z_L`` of a sentence never change, so they are computed once per sentence and kept,
keyed by the encoder's content (weights, config, tokenizer: see
:func:`~layerfusion_recipes.ner.cache_files.feature_key`) + max length + the sentence's token ids (shared by
every method, trial and shot size of a sweep; optionally persisted to a directory so that sweep
workers share it: each fill appends one safetensors shard with the sentences it added, written
atomically, and every fill first reads the shards other workers wrote since, so nothing is
computed or written twice; a damaged shard is reported, removed and recomputed, and temporary
files of crashed writers are removed: see :mod:`layerfusion_recipes.ner.cache_files`).

Training then *replays* the cache through the real model: inside :meth:`FeatureCache.replay`
every encoder block returns its cached output instead of computing it. The embeddings, the
capture hooks, the fusion module (with the last block's real call arguments, so R+n's extra
blocks get the real attention mask) and the head run as usual, so the cached path is the
uncached one minus the encoder's blocks.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from peft_layerfusion.discovery import EncoderBlocks
from peft_layerfusion.hooks import BlockCapture, Capture
from peft_layerfusion.utils import eval_mode

from ..core.runner import model_inputs
from ..data.readers import collate
from .cache_files import (
    SHARD_SUFFIX,
    CorruptShardError,
    feature_key,
    read_shard,
    remove_stale_temp_files,
    write_shard,
)


class FeatureCache:
    """``z_0 .. z_L`` per sentence for one frozen encoder.

    Args:
        base_model: The pretrained model (before any regime/fusion is applied); its blocks
            compute the features. Only its encoder is used.
        located: Its encoder blocks (``find_encoder_blocks(base_model)``).
        model_name: Name or path of the model (for messages; the key hashes the weights instead).
        max_length: Tokenizer max length (part of the cache key).
        directory: Optional folder where the cache is persisted (shards under ``features-<key>/``).
        tokenizer: The tokenizer that made the token ids (part of the cache key).

    Example:
        >>> cache = FeatureCache(base, find_encoder_blocks(base), "minilm", 128, tokenizer=tokenizer)
        >>> cache.fill(train_features + dev_features)
        >>> with cache.replay(located_of_trained_model, batch_states):
        ...     logits = model(input_ids=ids, attention_mask=mask).logits
    """

    def __init__(
        self,
        base_model: nn.Module,
        located: EncoderBlocks,
        model_name: str,
        max_length: int,
        directory: str | os.PathLike | None = None,
        tokenizer=None,
    ) -> None:
        self.base_model = base_model
        self.located = located
        self.model_name = model_name
        self.key = feature_key(base_model, tokenizer, max_length, located.num_blocks)
        self.path = Path(directory) / f"features-{self.key}" if directory else None  # shard folder
        self.states: dict[tuple[int, ...], torch.Tensor] = {}  # ids -> (L+1, seq, d)
        self._padded: dict[tuple, torch.Tensor] = {}  # memo of padded evaluation batches
        self._read_shards: set[str] = set()
        self.block_output_len: int | None = None  # None: blocks return a tensor; n: a tuple of n
        self.refresh()

    def __len__(self) -> int:
        return len(self.states)

    @torch.no_grad()
    def fill(self, features: Sequence[dict[str, list[int]]], batch_size: int = 64) -> int:
        """Compute the states of every sentence not cached yet; returns how many were added."""
        self.refresh()  # another worker may have computed some of them meanwhile
        missing = list(
            {tuple(f["input_ids"]): f for f in features if tuple(f["input_ids"]) not in self.states}.values()
        )
        if not missing:
            return 0
        captured: list[Capture] = []
        capture = BlockCapture(self.located, lambda c: captured.append(c))
        handle = self.located.blocks[-1].register_forward_hook(self._record_output_kind)
        try:
            with eval_mode(self.base_model):
                for start in range(0, len(missing), batch_size):
                    chunk = missing[start : start + batch_size]
                    batch = collate(chunk)
                    self.base_model(**model_inputs(batch))  # token types too: a BERT pair's segments
                    stacked = torch.stack(captured.pop().states, dim=0).float()  # (L+1, batch, seq, d)
                    for row, feature in enumerate(chunk):
                        length = len(feature["input_ids"])
                        self.states[tuple(feature["input_ids"])] = stacked[:, row, :length].clone()
        finally:
            capture.remove()
            handle.remove()
        self._write_shard([tuple(f["input_ids"]) for f in missing])
        return len(missing)

    def _record_output_kind(self, module: nn.Module, args: tuple, output: object) -> None:
        self.block_output_len = None if isinstance(output, torch.Tensor) else len(output)

    def refresh(self) -> int:
        """Read the shards written (by any worker) since the last call; returns how many.

        A shard that cannot be read (empty, truncated, foreign) is reported with its file name
        (``RuntimeWarning``) and removed: its sentences are computed again by the next fill.
        Temporary files of writers that died are removed (see ``remove_stale_temp_files``).
        """
        if self.path is None or not self.path.is_dir():
            return 0
        remove_stale_temp_files(self.path)
        new = sorted(p for p in self.path.glob(f"*{SHARD_SUFFIX}") if p.name not in self._read_shards)
        read = 0
        for shard in new:
            try:
                states, block_output_len = read_shard(shard, self.key, self.located.num_blocks)
            except CorruptShardError as error:
                warnings.warn(
                    f"feature cache: removing {error}; its sentences will be recomputed",
                    RuntimeWarning,
                    stacklevel=2,
                )
                shard.unlink(missing_ok=True)
                continue
            self.states.update(states)
            self.block_output_len = block_output_len
            self._read_shards.add(shard.name)
            read += 1
        return read

    def _write_shard(self, keys: Sequence[tuple[int, ...]]) -> None:
        """Persist the states of ``keys`` as one new shard (atomic: temp file + ``os.replace``)."""
        if self.path is None or not keys:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        name = f"shard-{uuid.uuid4().hex}{SHARD_SUFFIX}"
        states = {key: self.states[key] for key in keys}
        write_shard(self.path / name, states, self.block_output_len, self.key)
        self._read_shards.add(name)

    def batch_states(self, features: Sequence[dict[str, list[int]]], memo: bool = False) -> torch.Tensor:
        """Cached states of a batch, zero-padded: ``(L+1, batch, seq, d)``.

        With ``memo`` the padded tensor is kept for the next call with the same sentences
        (evaluation batches, identical every epoch and every run).
        """
        key = tuple(tuple(f["input_ids"]) for f in features)
        if memo and key in self._padded:
            return self._padded[key]
        tensors = [self.states[tuple(f["input_ids"])].transpose(0, 1) for f in features]  # (seq, L+1, d)
        out = pad_sequence(tensors, batch_first=True).permute(2, 0, 1, 3)  # (L+1, batch, seq, d), one copy
        if memo:
            self._padded[key] = out
        return out

    @contextmanager
    def replay(self, located: EncoderBlocks, states: torch.Tensor) -> Iterator[None]:
        """Inside, block ``i`` of ``located`` returns ``states[i + 1]`` without computing.

        Args:
            located: The blocks of the model being trained (same encoder as the cache's).
            states: ``(L+1, batch, seq, d)`` from :meth:`batch_states`.
        """
        if states.shape[0] != located.num_blocks + 1:
            raise ValueError(
                f"cached states have {states.shape[0] - 1} blocks, the model {located.num_blocks}"
            )
        for index, block in enumerate(located.blocks):
            block.forward = self._replayed(states[index + 1])
        try:
            yield
        finally:
            for block in located.blocks:
                del block.forward

    def _replayed(self, output: torch.Tensor):
        extra = self.block_output_len

        def forward(*args, **kwargs):
            reference = next(a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
            hidden = output.to(device=reference.device, dtype=reference.dtype)
            return hidden if extra is None else (hidden, *([None] * (extra - 1)))

        return forward
