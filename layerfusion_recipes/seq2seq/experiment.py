"""``layerfusion seq2seq``: sentence denoising on WikiText-2, the plain model (``none``) vs EncoderFusion vs
SurfaceFusion.

The grammatical-error-correction setting of Liu et al. (ICLR 2021), built offline: the
sentences of WikiText-2, cut into pieces of at most ``--max-words`` words, are corrupted
word by word (with probability ``--noise`` a word gets one of the ``--corruptions``: an
adjacent swap, a random word inserted before it, the word repeated, or, harder since
only world knowledge can undo them, a replacement or a deletion) and a small
encoder-decoder learns to restore them. The training pieces are corrupted afresh for
every seed and epoch; the dev pieces (the last ``--dev-sentences`` of the training text,
never trained on) and the test pieces once, identically for every run. The copy of the
corrupted input is scored beside the methods (``copy_input``): a model that has learned
the task must beat it.

* Tokenizer: word level, built with ``tokenizers`` from the training pieces (the
  ``--vocab-size`` most frequent words seen at least twice; the rest is ``<unk>``).
  References are the decoded target ids, so a restored ``<unk>`` counts as right.
* Model: a randomly initialised ``--architecture`` (Marian = the Transformer with
  sinusoidal positions, or BART; ``--width``, ``--layers``, ``--init-std``, ``--dropout``),
  identical initial weights for every method of a seed, every weight trained (the paper
  trains from scratch); AdamW with ``--warmup`` (fraction of the steps) then linear decay.
* Methods: ``none`` (the model alone), ``encoder_fusion`` (transparent attention, with
  ``x_0``), ``surface_hard`` (λ = 0.8) and ``surface_soft`` (τ = 1), the last three
  through ``get_peft_model``.
* Trials and learning rate: one model per method and ``--seeds`` value; with several
  ``--lr`` values, each method's is selected on the dev pieces (exact match, then
  chrF) with the first seed and used for all seeds.
* Metrics on dev and test: exact match, chrF and BLEU (sacrebleu), decoding greedy or
  with ``--beams`` (the fused scores drive the search); per method the test mean ± 95% t
  interval over seeds and the paired per-seed differences to ``none``.

Data: ``--data DIR`` with ``valid.txt`` (training sentences; the shared copy of
WikiText-2 has no train split) and ``test.txt``, or any two text files via ``--train-file``
and ``--test-file``. Results: one record per run appended to OUTPUT/results.jsonl, keyed by its
method, seed, learning rate and the comparison's settings and files
(:mod:`layerfusion_recipes.seq2seq.records`); an invocation reuses the runs finished under the same
settings and files (resume). OUTPUT/results.json,
written atomically when the comparison completes, summarises it.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import torch
from peft import get_peft_model
from torch import nn

from ..core.engine.loop import TrainingLoop
from ..core.models.models import peft_alias_quiet
from ..core.options.grids import LrGrids
from ..core.results.records import run_or_resume
from ..core.results.selection import best_on_dev, select_then_repeat
from ..core.results.summary import Layout, fields, paired_by_trial, summarize_groups
from .records import run_key
from .settings import Seq2SeqSettings
from .variants import PLAIN_MODEL, method_configs

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0..3
PAD, BOS, EOS, UNK = range(4)
METRICS = ("exact_match", "chrf", "bleu")
DEV_SEED, TEST_SEED = 2, 1  # corruption seeds of the dev and test pairs (fixed for every run and seed)
METHOD_NAMES: tuple[str, ...] = tuple(method_configs())


# ----------------------------------------------------------------------------- data
def sentences_of(paragraphs: Sequence[str], max_words: int) -> list[str]:
    """Sentences (split after `` . ``) cut into pieces of at most ``max_words`` words, headings skipped.

    A longer sentence gives consecutive pieces of ``max_words`` words; pieces (and
    sentences) shorter than 4 words are dropped.

    Example:
        >>> sentences_of(["It is big . It is red and round .", " = Title = "], 4)
        ['It is big .', 'It is red and']
    """
    found = []
    for paragraph in paragraphs:
        if paragraph.lstrip().startswith("="):
            continue
        for sentence in re.split(r"(?<= \.) ", paragraph):
            words = sentence.split()
            pieces = (words[start : start + max_words] for start in range(0, len(words), max_words))
            found += [" ".join(piece) for piece in pieces if len(piece) >= 4]
    return found


def corrupt(
    words: list[str],
    vocabulary: Sequence[str],
    noise: float,
    rng: random.Random,
    kinds: Sequence[str] = ("replace", "delete", "swap"),
) -> list[str]:
    """Corrupt each word with probability ``noise`` by one of ``kinds``, drawn uniformly.

    Kinds (:data:`CORRUPTIONS`): ``replace`` the word by a random word of ``vocabulary``,
    ``delete`` it, ``swap`` it with its right neighbour, ``insert`` a random word before it,
    ``repeat`` it (the word twice). A kind that does not apply (deleting the only word,
    swapping the last one) leaves the word as it is. The words an edit produced are not
    corrupted again.

    Args:
        words: The sentence's words.
        vocabulary: Words to replace with or insert.
        noise: Probability that a word is corrupted.
        rng: The random source (seeded by the caller).
        kinds: The corruptions to draw from.

    Example:
        >>> corrupt("the cat sat".split(), ["dog"], 0.0, random.Random(0))
        ['the', 'cat', 'sat']
        >>> corrupt("the cat sat".split(), ["dog"], 1.0, random.Random(0), kinds=["repeat"])
        ['the', 'the', 'cat', 'cat', 'sat', 'sat']
    """
    out = list(words)
    index = 0
    while index < len(out):
        if rng.random() < noise:
            kind = kinds[rng.randrange(len(kinds))]
            if kind == "replace":
                out[index] = rng.choice(vocabulary)
            elif kind == "delete" and len(out) > 1:
                del out[index]
                continue
            elif kind == "swap" and index + 1 < len(out):
                out[index], out[index + 1] = out[index + 1], out[index]
                index += 1
            elif kind == "insert":
                out.insert(index, rng.choice(vocabulary))
                index += 1
            elif kind == "repeat":
                out.insert(index, out[index])
                index += 1
        index += 1
    return out


def build_tokenizer(sentences: Sequence[str], vocab_size: int = 2000):
    """A word-level ``tokenizers.Tokenizer``: the ``vocab_size`` most frequent words seen at least twice.

    Example:
        >>> build_tokenizer(["a b .", "a c ."]).encode("a c").ids
        [5, 3]
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(
        vocab_size=vocab_size + len(SPECIALS), min_frequency=2, special_tokens=list(SPECIALS)
    )
    tokenizer.train_from_iterator(sentences, trainer)
    return tokenizer


def denoising_pairs(
    sentences: Sequence[str], settings: Seq2SeqSettings, seed: int, vocabulary: Sequence[str] | None = None
) -> list[tuple[str, str]]:
    """``(corrupted, original)`` pairs; replaced and inserted words drawn from ``vocabulary``.

    ``vocabulary`` defaults to the sentences' own words. The comparison passes the
    tokenizer's words (:func:`known_words`): a random corpus word is mostly out of
    vocabulary, and an inserted ``<unk>`` cannot be told from a real one.

    Example:
        >>> denoising_pairs(["a b c d"], Seq2SeqSettings(noise=0.0), seed=0)
        [('a b c d', 'a b c d')]
    """
    rng = random.Random(seed)
    vocabulary = sorted({w for s in sentences for w in s.split()}) if vocabulary is None else vocabulary
    kinds = settings.corruption_kinds
    return [(" ".join(corrupt(s.split(), vocabulary, settings.noise, rng, kinds)), s) for s in sentences]


def known_words(tokenizer) -> list[str]:
    """The tokenizer's words, specials left out, in id order."""
    vocabulary = tokenizer.get_vocab()
    return [w for w in sorted(vocabulary, key=vocabulary.__getitem__) if w not in SPECIALS]


def encode(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    return [encoding.ids + [EOS] for encoding in tokenizer.encode_batch(list(texts))]


def pad(rows: Sequence[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


def batches(pairs: list[tuple[list[int], list[int]]], size: int, rng: random.Random | None):
    order = list(range(len(pairs)))
    if rng is not None:
        rng.shuffle(order)
    for start in range(0, len(order), size):
        chunk = [pairs[i] for i in order[start : start + size]]
        source = pad([s for s, _ in chunk], PAD)
        yield {
            "input_ids": source,
            "attention_mask": (source != PAD).long(),
            "labels": pad([t for _, t in chunk], -100),
        }


# ----------------------------------------------------------------------------- models
def build_model(vocab_size: int, settings: Seq2SeqSettings) -> nn.Module:
    """A random encoder-decoder; the same seed gives every method the same initial weights.

    ``settings.architecture``: ``marian`` is the Transformer of Vaswani et al. (sinusoidal
    positions, shared embeddings; the paper's model family), ``bart`` a BART (learned
    positions, an extra embedding layer norm). Both are post-norm with ``settings.layers``
    blocks on each side, 4 heads and a feed-forward width of ``2 * settings.width``.
    ``settings.init_std`` (0.1) is larger than the 0.02 of both: trained from scratch for a
    few hundred steps on CPU, the small model learns to copy faster with the larger init.

    Example:
        >>> build_model(100, Seq2SeqSettings(width=32, layers=1)).config.model_type
        'marian'
    """
    from transformers import BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel

    torch.manual_seed(settings.seed)
    shape = dict(
        vocab_size=vocab_size, d_model=settings.width, encoder_layers=settings.layers,
        decoder_layers=settings.layers, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=2 * settings.width, decoder_ffn_dim=2 * settings.width,
        max_position_embeddings=4 * settings.max_words + 8, pad_token_id=PAD, bos_token_id=BOS,
        eos_token_id=EOS, decoder_start_token_id=EOS, forced_eos_token_id=None,
        scale_embedding=True, dropout=settings.dropout, init_std=settings.init_std,
    )  # fmt: skip
    if settings.architecture == "marian":
        return MarianMTModel(MarianConfig(**shape, share_encoder_decoder_embeddings=True))
    return BartForConditionalGeneration(BartConfig(**shape, forced_bos_token_id=None))


def with_method(model: nn.Module, method: str) -> nn.Module:
    """``model`` adapted by ``method``, every weight trainable (training from scratch)."""
    config = method_configs()[method]
    if config is None:
        return model
    with peft_alias_quiet():
        adapted = get_peft_model(model, config())
    for parameter in adapted.parameters():
        parameter.requires_grad_(True)
    return adapted


# ----------------------------------------------------------------------------- train / evaluate
def train(model: nn.Module, epoch_pairs: Callable[[int], list], settings: Seq2SeqSettings) -> float:
    """AdamW (weight decay 0.01) with linear warm-up then linear decay to zero, gradients clipped to
    norm 1 (:class:`~layerfusion_recipes.core.engine.loop.TrainingLoop`); ``epoch_pairs(epoch)`` gives each
    epoch's (freshly corrupted) pairs. Returns the last epoch's mean loss."""
    steps = settings.epochs * -(-len(epoch_pairs(0)) // settings.batch_size)
    groups = [{"params": [p for p in model.parameters() if p.requires_grad], "lr": settings.learning_rate}]
    warmup = max(1, round(settings.warmup * steps))
    # the model's init was seeded by build_model; torch's stream continues from there
    loop = TrainingLoop(
        model, groups, steps, seed=None, weight_decay=0.01, warmup_steps=warmup, clip_norm=1.0
    )
    rng = random.Random(settings.seed)
    for epoch in range(settings.epochs):
        losses = []
        for batch in batches(epoch_pairs(epoch), settings.batch_size, rng):
            loss = loop.model(**{key: value.to(loop.device) for key, value in batch.items()}).loss
            loop.step(loss)
            losses.append(loss.item())
    return sum(losses) / len(losses)


def decode(tokenizer, rows: Sequence[list[int]]) -> list[str]:
    """Words of each id row up to its first ``</s>`` (``<unk>`` kept, ``<pad>``/``<s>`` dropped)."""
    texts = []
    for row in rows:
        row = list(row)
        row = row[: row.index(EOS)] if EOS in row else row
        words = (tokenizer.id_to_token(i) or "<unk>" for i in row if i not in (PAD, BOS) and i >= 0)
        texts.append(" ".join(words))
    return texts


def score(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Exact match (%), chrF and BLEU (sacrebleu, default settings).

    Example:
        >>> score(["a b c"], ["a b c"])["exact_match"]
        100.0
    """
    import sacrebleu

    exact = 100.0 * sum(h == r for h, r in zip(hypotheses, references, strict=True)) / len(references)
    return {
        "exact_match": exact,
        "chrf": sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score,
        # force: WikiText is already tokenized (" ." at the end), which sacrebleu would warn about
        "bleu": sacrebleu.corpus_bleu(list(hypotheses), [list(references)], force=True).score,
    }


@torch.no_grad()
def evaluate(model: nn.Module, tokenizer, pairs: list, settings: Seq2SeqSettings) -> dict[str, float]:
    """Scores of the decoded outputs (greedy, or ``settings.beams``) against the decoded targets."""
    model.eval()
    hypotheses, references = [], []
    for batch in batches(pairs, 64, None):
        generated = model.generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=settings.beams,
            max_new_tokens=batch["labels"].shape[1] + 4, do_sample=False,
        )  # fmt: skip
        hypotheses += decode(tokenizer, generated[:, 1:].tolist())  # drop the decoder start token
        references += decode(tokenizer, batch["labels"].tolist())
    return score(hypotheses, references)


@dataclass(frozen=True)
class DenoisingData:
    """The sentences of one comparison, split, with their tokenizer and fixed dev/test pairs.

    ``train`` is corrupted afresh for every seed and epoch (:meth:`train_pairs`); ``dev``
    (the last ``dev_sentences`` pieces of the training text, never trained on) and
    ``test`` are corrupted once, with seeds :data:`DEV_SEED` and :data:`TEST_SEED`, so every
    run and seed is scored on the same pairs.
    """

    settings: Seq2SeqSettings
    tokenizer: Any
    train: list[str]
    dev_pairs: list[tuple[list[int], list[int]]]
    test_pairs: list[tuple[list[int], list[int]]]

    @classmethod
    def build(cls, train_text: Sequence[str], test_text: Sequence[str], settings: Seq2SeqSettings):
        """Split, tokenize and corrupt the texts.

        Example:
            >>> settings = Seq2SeqSettings(dev_sentences=4, width=16, layers=1, epochs=2, batch_size=8)
            >>> from layerfusion_recipes.data.readers import read_text
            >>> data = DenoisingData.build(
            ...     read_text(f"{text_path}/valid.txt"), read_text(f"{text_path}/test.txt"), settings
            ... )
            >>> len(data.train), len(data.dev_pairs), len(data.test_pairs)  # 40-word lines, 10-word pieces
            (24, 4, 32)
            >>> data.copy_scores()["test"]["exact_match"]  # the corrupted input left as it is
            9.375
        """
        pieces = sentences_of(train_text, settings.max_words)
        held_out = len(pieces) - settings.dev_sentences
        train, dev = pieces[: max(held_out, 0)][: settings.train_sentences], pieces[max(held_out, 0) :]
        test = sentences_of(test_text, settings.max_words)[: settings.test_sentences]
        if not train or not test or (settings.dev_sentences and not dev):
            raise ValueError(
                f"No sentences of 4..{settings.max_words} words left for training, dev or test: "
                f"{len(pieces)} training pieces for dev_sentences={settings.dev_sentences}, {len(test)} test."
            )
        tokenizer = build_tokenizer(train, settings.vocab_size)
        encoded = partial(encoded_pairs, tokenizer, settings=settings)
        return cls(settings, tokenizer, train, encoded(dev, seed=DEV_SEED), encoded(test, seed=TEST_SEED))

    @property
    def vocab_size(self) -> int:
        return max(self.tokenizer.get_vocab().values()) + 1

    def train_pairs(self, seed: int, epoch: int) -> list[tuple[list[int], list[int]]]:
        """The pairs of ``epoch`` in a run of seed ``seed`` (corrupted with ``seed + 1000·epoch``)."""
        return encoded_pairs(self.tokenizer, self.train, self.settings, seed + 1000 * epoch)

    def copy_scores(self) -> dict[str, dict[str, float]]:
        """The corrupted input itself as the output (the no-model reference), on dev and test."""
        splits = {"dev": self.dev_pairs, "test": self.test_pairs}
        return {
            name: score(
                decode(self.tokenizer, [s for s, _ in pairs]), decode(self.tokenizer, [t for _, t in pairs])
            )
            for name, pairs in splits.items()
            if pairs
        }


def encoded_pairs(tokenizer, sentences: Sequence[str], settings: Seq2SeqSettings, seed: int) -> list:
    """``(source ids, target ids)`` of the sentences corrupted with ``seed`` (inserted words: known ones)."""
    pairs = denoising_pairs(sentences, settings, seed, known_words(tokenizer))
    sources, targets = encode(tokenizer, [s for s, _ in pairs]), encode(tokenizer, [t for _, t in pairs])
    return list(zip(sources, targets, strict=True))


def run_one(data: DenoisingData, method: str, seed: int, learning_rate: float) -> dict[str, Any]:
    """Train ``method`` from the seed's initial weights and score it on dev and test; one record.

    Example:
        >>> settings = Seq2SeqSettings(dev_sentences=4, width=16, layers=1, epochs=2, batch_size=8)
        >>> from layerfusion_recipes.data.readers import read_text
        >>> data = DenoisingData.build(
        ...     read_text(f"{text_path}/valid.txt"), read_text(f"{text_path}/test.txt"), settings
        ... )
        >>> record = run_one(data, "none", seed=0, learning_rate=3e-3)
        >>> record["method"], record["learning_rate"], sorted(record["dev"])  # test scores at the top level
        ('none', 0.003, ['bleu', 'chrf', 'exact_match'])
        >>> 0 <= record["exact_match"] <= 100
        True
    """
    settings = replace(data.settings, seed=seed, learning_rate=learning_rate)
    started, cpu_started = time.perf_counter(), time.process_time()
    model = with_method(build_model(data.vocab_size, settings), method)
    loss = train(model, lru_cache(maxsize=1)(partial(data.train_pairs, seed)), settings)
    dev = evaluate(model, data.tokenizer, data.dev_pairs, settings) if data.dev_pairs else None
    test = evaluate(model, data.tokenizer, data.test_pairs, settings)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        "method": method, "seed": seed, "learning_rate": learning_rate, "train_loss": loss, **test,
        "dev": dev, "seconds": seconds, "cpu_seconds": cpu_seconds,
    }  # fmt: skip


def select_learning_rate(runs: Sequence[dict[str, Any]], method: str, seed: int) -> float:
    """The learning rate of ``method``'s best dev exact match (then dev chrF) among its runs of ``seed``.

    Example:
        >>> select_learning_rate([{"method": "m", "seed": 0, "learning_rate": 1e-3,
        ...     "dev": {"exact_match": 5.0, "chrf": 70.0}}], "m", 0)
        0.001
    """
    candidates = [r for r in runs if r["method"] == method and r["seed"] == seed]
    if not candidates:
        raise ValueError(_unscored(method, seed))
    return best_on_dev({r["learning_rate"]: dev_score(r) for r in candidates})


def _unscored(method: str, seed: int) -> str:
    return f"method={method!r}, seed={seed}: no runs scored on dev to select a learning rate from"


def dev_score(record: dict[str, Any]) -> tuple[float, float]:
    """A run's dev exact match, then dev chrF (the learning rate's selection score)."""
    if record["dev"] is None:
        raise ValueError(_unscored(record["method"], record["seed"]))
    return record["dev"]["exact_match"], record["dev"]["chrf"]


def run_comparison(
    data: DenoisingData,
    methods: Sequence[str],
    seeds: Sequence[int] = (0,),
    lr: LrGrids | None = None,
    results: Path | None = None,
    setup: str = "",
    finished: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Every method over every seed on the same data; its learning rate selected on dev first.

    With more than one learning rate, each method is trained at each on the first seed and
    the one with the best dev exact match is used for all seeds (its first-seed run is one
    of the trials: selection never looks at test;
    :func:`~layerfusion_recipes.core.results.selection.select_then_repeat`).
    A run whose key (:func:`~layerfusion_recipes.seq2seq.records.run_key` with ``setup``) is in
    ``finished`` is reused, so an interrupted comparison resumes; a new one is appended to ``results``.

    Args:
        data: The split, tokenized and corrupted sentences.
        methods: Names from :data:`METHOD_NAMES`.
        seeds: The trials (model initialisation, training corruption and order).
        lr: Each method's learning rates, as every task holds them
            (:data:`~layerfusion_recipes.core.options.grids.LrGrids`: ``{method: (LR, ...)}``); a
            method it leaves out (all of them with ``None``) trains at ``data.settings.learning_rate``.
        results: The results file each new run is appended to (``None``: kept in memory only).
        setup: The comparison's fingerprint (:func:`~layerfusion_recipes.seq2seq.records.comparison_setup`).
        finished: The runs finished earlier by key
            (:func:`~layerfusion_recipes.core.results.records.finished_records`); the new ones are added.

    Returns:
        ``runs`` (the record of every run the comparison used, in the order it asked for them),
        ``selected_learning_rate`` per method, ``copy_input`` (dev and test scores) and ``summary``
        (see :func:`summarize`).

    Example:
        >>> settings = Seq2SeqSettings(dev_sentences=4, width=16, layers=1, epochs=2, batch_size=8)
        >>> from layerfusion_recipes.data.readers import read_text
        >>> data = DenoisingData.build(
        ...     read_text(f"{text_path}/valid.txt"), read_text(f"{text_path}/test.txt"), settings
        ... )
        >>> methods = ["none", "surface_hard"]  # of METHOD_NAMES
        >>> lr = dict.fromkeys(methods, (1e-3, 3e-3))
        >>> results = run_comparison(data, methods, seeds=(0, 1), lr=lr)
        | none | 0 | 0.001 | ...
        | none | 0 | 0.003 | ...
        | none | 1 | ...
        | surface_hard | 0 | 0.001 | ...
        | surface_hard | 0 | 0.003 | ...
        | surface_hard | 1 | ...
        >>> len(results["runs"]), [row["seeds"] for row in results["summary"]]  # 2 LRs on seed 0, then 1 seed
        (6, [[0, 1], [0, 1]])
    """
    unknown = [m for m in methods if m not in METHOD_NAMES]
    if unknown or not seeds:
        raise ValueError(
            f"methods={list(methods)}, seeds={list(seeds)}: methods from {METHOD_NAMES}, seeds >= 1"
        )
    given = lr or {}
    grids = {method: tuple(given.get(method) or (data.settings.learning_rate,)) for method in methods}
    finished = {} if finished is None else finished
    runs: dict[str, dict[str, Any]] = {}  # the comparison's, by key, in the order it asked for them

    def run(method: str, learning_rate: float, seed: int) -> dict[str, Any]:
        key = run_key(method, seed, learning_rate, setup)

        def train() -> dict[str, Any]:
            record = run_one(data, method, seed, learning_rate)
            print(run_row(record), flush=True)
            return record

        if results is None:
            record = finished[key] = finished.get(key) or {**train(), "key": key}
        else:
            record, _ = run_or_resume(results, finished, key, train)
        runs.setdefault(key, record)
        return record

    selected = {
        method: select_then_repeat(grids[method], seeds, partial(run, method), dev_score)[0]
        for method in methods
    }
    chosen = [r for r in runs.values() if r["learning_rate"] == selected[r["method"]]]
    return {
        "runs": list(runs.values()),
        "selected_learning_rate": selected,
        "copy_input": data.copy_scores(),
        "summary": summarize(chosen, methods),
    }


# the runs of one comparison at each method's selected learning rate, over seeds
SEQ2SEQ_LAYOUT = Layout(trial="seed", lr="learning_rate", metrics=fields(*METRICS))


def summarize(runs: Sequence[dict[str, Any]], methods: Sequence[str], reference: str = PLAIN_MODEL) -> list:
    """Per method: mean and 95% t half-width over seeds of each test metric, and of the paired
    per-seed differences to ``reference`` (seeds both have), as ``[mean, half_width]`` (the one
    summariser, :func:`~layerfusion_recipes.core.results.summary.summarize_groups`, with
    :data:`SEQ2SEQ_LAYOUT`).

    Args:
        runs: The runs at each method's selected learning rate (one per method and seed).
        methods: The rows, in order (a method without runs: no seeds, ``None`` scores).
        reference: The method the differences are taken to.

    Example:
        >>> runs = [{"method": m, "seed": s, "exact_match": e, "chrf": e, "bleu": e}
        ...         for m, s, e in [("none", 0, 1.0), ("none", 1, 3.0), ("x", 0, 2.0), ("x", 1, 5.0)]]
        >>> summarize(runs, ["none", "x"])[1]["vs_none"]["exact_match"]  # diffs 1, 2
        [1.5, 6.353...]
    """
    groups = summarize_groups(runs, SEQ2SEQ_LAYOUT)
    pairs = [(method, reference) for method in methods if method != reference]
    paired = {metric: paired_by_trial(groups, pairs, metric) for metric in METRICS}
    rows = []
    for method in methods:
        group = groups.get(((), method))
        row: dict[str, Any] = {"method": method, "seeds": sorted(group.runs) if group else []}
        for metric in METRICS:
            row[metric] = list(group.stats[metric][:2]) if group else None
        differences = {
            metric: p.difference for metric in METRICS for p in paired[metric] if p.first == method
        }
        if differences:
            row[f"vs_{reference}"] = {metric: list(differences[metric][:2]) for metric in METRICS}
        rows.append(row)
    return rows


RUN_COLUMNS = ("method", "seed", "LR", "dev EM", "dev chrF", "EM", "chrF", "BLEU", "seconds")
RUN_TABLE_HEADER = "| " + " | ".join(RUN_COLUMNS) + " |\n|" + "---|" * len(RUN_COLUMNS)


def run_row(record: dict[str, Any]) -> str:
    """One run as a row of the :data:`RUN_TABLE_HEADER` table: dev EM and chrF, then test EM, chrF, BLEU.

    Example:
        >>> scores = {"exact_match": 47.2, "chrf": 88.82, "bleu": 88.26}
        >>> run = {"method": "none", "seed": 0, "learning_rate": 3e-3, **scores, "seconds": 260.4,
        ...        "dev": {"exact_match": 41.0, "chrf": 87.47}}
        >>> print(run_row(run))
        | none | 0 | 0.003 | 41.0 | 87.5 | 47.2 | 88.8 | 88.3 | 260 |
    """
    dev = record["dev"] or {"exact_match": float("nan"), "chrf": float("nan")}
    scores = [dev["exact_match"], dev["chrf"], *(record[metric] for metric in METRICS)]
    cells = [
        record["method"],
        str(record["seed"]),
        f"{record['learning_rate']:g}",
        *(f"{v:.1f}" for v in scores),
    ]
    return "| " + " | ".join([*cells, f"{record['seconds']:.0f}"]) + " |"


def summary_table(results: dict[str, Any]) -> str:
    """Markdown: the copy baseline, then each method's test mean ± 95% CI and paired difference to ``none``.

    Example:
        >>> copy = {"exact_match": 25.4, "chrf": 88.8, "bleu": 81.0}
        >>> row = {"method": "none", "exact_match": [48.0, 1.8], "chrf": [88.9, 0.6], "bleu": [88.5, 1.2]}
        >>> results = {"copy_input": {"test": copy}, "summary": [row]}
        >>> results["selected_learning_rate"] = {"none": 3e-3}
        >>> print(summary_table(results))  # results of run_comparison
        | method | LR | exact match | chrF | BLEU | Δ EM vs none | Δ chrF | Δ BLEU |
        |---|---|---|---|---|---|---|---|
        | copy the corrupted input | - | 25.4 | 88.8 | 81.0 | | | |
        | none | 0.003 | 48.0 ± 1.8 | 88.9 ± 0.6 | 88.5 ± 1.2 | - | - | - |
    """

    def cell(value: list[float] | None, signed: bool = False) -> str:
        return "-" if value is None else f"{value[0]:{'+' if signed else ''}.1f} ± {value[1]:.1f}"

    lines = [
        "| method | LR | exact match | chrF | BLEU | Δ EM vs none | Δ chrF | Δ BLEU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    copy = results["copy_input"]["test"]
    lines.append(
        "| copy the corrupted input | - | " + " | ".join(f"{copy[m]:.1f}" for m in METRICS) + " | | | |"
    )
    for row in results["summary"]:
        paired = row.get("vs_none") or {}
        cells = [cell(row[m]) for m in METRICS] + [cell(paired.get(m), signed=True) for m in METRICS]
        lr = results["selected_learning_rate"][row["method"]]
        lines.append(f"| {row['method']} | {lr:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
