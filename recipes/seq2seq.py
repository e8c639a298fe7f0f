"""``layerfusion seq2seq``: sentence denoising on WikiText-2, vanilla vs EncoderFusion vs SurfaceFusion.

The grammatical-error-correction setting of Liu et al. (ICLR 2021), built offline: the
sentences of WikiText-2, cut into pieces of at most ``--max-words`` words, are corrupted
word by word (with probability ``--noise`` a word is replaced by a random word of the
corpus, deleted, or swapped with its right neighbour) and a small encoder-decoder learns
to restore them. The training pieces are corrupted afresh every epoch (seeded), the test
pieces once; the copy of the corrupted input is scored beside the methods (``copy_input``).

* Tokenizer: word level, built with ``tokenizers`` from the training pieces (the
  ``--vocab-size`` most frequent words seen at least twice; the rest is ``<unk>``).
  References are the decoded target ids, so a restored ``<unk>`` counts as right.
* Model: a randomly initialised BART (``--width``, ``--layers``, ``--init-std``),
  identical initial weights for every method, every weight trained (the paper trains
  from scratch); AdamW with ``--warmup`` (fraction of the steps) then linear decay.
* Methods: ``vanilla`` (the model alone), ``encoder_fusion`` (transparent attention, with
  ``x_0``), ``surface_hard`` (λ = 0.8) and ``surface_soft`` (τ = 1), the last three
  through ``get_peft_model``.
* Metrics on the test sentences: exact match, chrF and BLEU (sacrebleu), decoding greedy or
  with ``--beams`` (the fused scores drive the search).

Data: ``--data DIR`` with ``valid.txt`` (training sentences; the shared copy of
WikiText-2 has no train split) and ``test.txt``, or any two text files via ``--train-file``
and ``--test-file``. Results: OUTPUT/results.json (written atomically) and a table on stdout.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import get_linear_schedule_with_warmup

from peft_layerfusion.utils import atomic_write_json

from .arguments import Seq2SeqSettings
from .data import read_text

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0..3
PAD, BOS, EOS, UNK = range(4)


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


def corrupt(words: list[str], vocabulary: Sequence[str], noise: float, rng: random.Random) -> list[str]:
    """Replace, delete or swap each word with probability ``noise`` (one of the three, uniformly).

    Example:
        >>> corrupt("the cat sat".split(), ["dog"], 0.0, random.Random(0))
        ['the', 'cat', 'sat']
    """
    out = list(words)
    index = 0
    while index < len(out):
        if rng.random() < noise:
            action = rng.randrange(3)
            if action == 0:
                out[index] = rng.choice(vocabulary)
            elif action == 1 and len(out) > 1:
                del out[index]
                continue
            elif action == 2 and index + 1 < len(out):
                out[index], out[index + 1] = out[index + 1], out[index]
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


def denoising_pairs(sentences: Sequence[str], settings: Seq2SeqSettings, seed: int) -> list[tuple[str, str]]:
    """``(corrupted, original)`` pairs; corruption drawn from the sentences' own words."""
    rng = random.Random(seed)
    vocabulary = sorted({w for s in sentences for w in s.split()})
    return [(" ".join(corrupt(s.split(), vocabulary, settings.noise, rng)), s) for s in sentences]


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
    """A random BART; the same seed gives every method the same initial weights.

    ``settings.init_std`` (0.1) is larger than BART's 0.02: trained from scratch for a few
    hundred steps on CPU, the small model only learns to copy and edit with the larger init.
    """
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(settings.seed)
    config = BartConfig(
        vocab_size=vocab_size, d_model=settings.width, encoder_layers=settings.layers,
        decoder_layers=settings.layers, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=2 * settings.width, decoder_ffn_dim=2 * settings.width,
        max_position_embeddings=4 * settings.max_words + 8, pad_token_id=PAD, bos_token_id=BOS,
        eos_token_id=EOS, decoder_start_token_id=EOS, forced_eos_token_id=None, forced_bos_token_id=None,
        scale_embedding=True, dropout=0.1, init_std=settings.init_std,
    )  # fmt: skip
    return BartForConditionalGeneration(config)


def with_method(model: nn.Module, method: str) -> nn.Module:
    """``model`` adapted by ``method``, every weight trainable (training from scratch)."""
    if method == "vanilla":
        return model
    from peft import get_peft_model

    from peft_layerfusion import EncoderFusionConfig, SurfaceFusionConfig

    configs = {
        "encoder_fusion": lambda: EncoderFusionConfig(include_embeddings=True),
        "surface_hard": lambda: SurfaceFusionConfig(fusion="hard", fusion_lambda=0.8),
        "surface_soft": lambda: SurfaceFusionConfig(fusion="soft", temperature=1.0),
    }
    adapted = get_peft_model(model, configs[method]())
    for parameter in adapted.parameters():
        parameter.requires_grad_(True)
    return adapted


# ----------------------------------------------------------------------------- train / evaluate
def train(model: nn.Module, epoch_pairs: Callable[[int], list], settings: Seq2SeqSettings) -> float:
    """AdamW with linear warm-up then linear decay to zero (transformers' schedule);
    ``epoch_pairs(epoch)`` gives each epoch's (freshly corrupted) pairs.
    Returns the last epoch's mean loss."""
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=settings.learning_rate
    )
    steps = settings.epochs * -(-len(epoch_pairs(0)) // settings.batch_size)
    schedule = get_linear_schedule_with_warmup(optimizer, max(1, round(settings.warmup * steps)), steps)
    rng = random.Random(settings.seed)
    model.train()
    for epoch in range(settings.epochs):
        losses = []
        for batch in batches(epoch_pairs(epoch), settings.batch_size, rng):
            loss = model(**batch).loss
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
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


def run_comparison(
    train_text: Sequence[str], test_text: Sequence[str], settings: Seq2SeqSettings, methods: Sequence[str]
) -> list[dict[str, Any]]:
    """Train and evaluate each method on the same data and initial weights; one record each.

    Example:
        >>> texts = read_text("valid.txt"), read_text("test.txt")
        >>> records = run_comparison(*texts, Seq2SeqSettings(), METHOD_NAMES)
    """
    train_sentences = sentences_of(train_text, settings.max_words)[: settings.train_sentences]
    test_sentences = sentences_of(test_text, settings.max_words)[: settings.test_sentences]
    if not train_sentences or not test_sentences:
        raise ValueError(f"No sentences of 4..{settings.max_words} words found in the training or test text.")
    tokenizer = build_tokenizer(train_sentences, settings.vocab_size)

    def encoded(sentences: Sequence[str], seed: int) -> list:
        pairs = denoising_pairs(sentences, settings, seed)
        sources, targets = encode(tokenizer, [s for s, _ in pairs]), encode(tokenizer, [t for _, t in pairs])
        return list(zip(sources, targets, strict=True))

    # Training sentences are corrupted afresh each epoch (seed + 1000·epoch); the test once (seed + 1).
    epochs = [encoded(train_sentences, settings.seed + 1000 * epoch) for epoch in range(settings.epochs)]
    test_pairs = encoded(test_sentences, settings.seed + 1)
    records = []
    for method in methods:
        started = time.perf_counter()
        model = with_method(build_model(max(tokenizer.get_vocab().values()) + 1, settings), method)
        loss = train(model, epochs.__getitem__, settings)
        scores = evaluate(model, tokenizer, test_pairs, settings)
        records.append(
            {"method": method, "train_loss": loss, **scores, "seconds": time.perf_counter() - started}
        )
        print(_row(records[-1]), flush=True)
    # The corrupted input itself as the output: the no-model reference.
    copy_scores = score(
        decode(tokenizer, [s for s, _ in test_pairs]), decode(tokenizer, [t for _, t in test_pairs])
    )
    records.append({"method": "copy_input", **copy_scores, "train_loss": None, "seconds": 0.0})
    return records


def _row(record: dict[str, Any]) -> str:
    return (
        f"| {record['method']} | {record['exact_match']:.1f} | {record['chrf']:.1f} | {record['bleu']:.1f} "
        f"| {record['seconds']:.0f} |"
    )


# ----------------------------------------------------------------------------- command line
def seq2seq_main(args: argparse.Namespace) -> int:
    data = Path(args.data) if args.data else None
    train_file = Path(args.train_file) if args.train_file else (data / "valid.txt" if data else None)
    test_file = Path(args.test_file) if args.test_file else (data / "test.txt" if data else None)
    if train_file is None or test_file is None:
        raise SystemExit(
            "layerfusion seq2seq: give --data DIR (valid.txt, test.txt) or --train-file and --test-file"
        )
    settings = Seq2SeqSettings(**{k: getattr(args, k) for k in asdict(Seq2SeqSettings())})
    torch.set_num_threads(args.threads)
    print("| method | exact match % | chrF | BLEU | seconds |\n|---|---|---|---|---|", flush=True)
    records = run_comparison(read_text(train_file), read_text(test_file), settings, args.methods)
    print(_row(records[-1]))
    output = Path(args.output) / "results.json"
    files = {"train_file": str(train_file), "test_file": str(test_file)}
    atomic_write_json(output, {"settings": asdict(settings), **files, "records": records})
    print(f"results: {output}")
    return 0
