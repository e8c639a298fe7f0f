"""A tiny random BERT + WordPiece tokenizer and a toy NER corpus, for tests and smoke runs (no download)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import torch

from .data import NerDataset, NerSentence

WORDS = (
    "alice",
    "bob",
    "paris",
    "london",
    "acme",
    "corp",
    "went",
    "to",
    "the",
    "works",
    "at",
    "and",
    "met",
    "in",
    "city",
    "visited",
    "today",
    "with",
    "##s",
    "##ed",
)
ENTITIES = {"alice": "PER", "bob": "PER", "paris": "LOC", "london": "LOC", "acme": "ORG"}


def write_tiny_model(directory: str | os.PathLike, seed: int = 0, layers: int = 3, width: int = 32) -> str:
    """Save a tiny random BERT (``layers`` blocks, width ``width``) and its tokenizer; return the path.

    Example:
        >>> path = write_tiny_model(tmp_path / "tiny")
        >>> AutoModelForTokenClassification.from_pretrained(path, num_labels=5)
    """
    from transformers import BertConfig, BertModel

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *"abcdefghijklmnopqrstuvwxyz"]
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    vocab = list(dict.fromkeys(vocab))
    wordpiece_tokenizer(vocab).save_pretrained(directory)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(dict.fromkeys(vocab)),
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=2 * width,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(directory)
    return str(directory)


def wordpiece_tokenizer(vocab: list[str]):
    """A lower-casing BERT-style WordPiece fast tokenizer over ``vocab``, built with ``tokenizers``.

    Built from parts rather than ``BertTokenizerFast(vocab=...)``, whose vocabulary arguments
    differ between transformers 4.57 and 5.x.

    Example:
        >>> tokenizer = wordpiece_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "paris"])
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ids = {token: i for i, token in enumerate(vocab)}
    backend = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def toy_sentence(rng: random.Random) -> NerSentence:
    """A random sentence over :data:`WORDS` with BIO tags from :data:`ENTITIES` ("acme corp" is one ORG)."""
    tokens, tags = [], []
    for _ in range(rng.randint(3, 8)):
        word = rng.choice([w for w in WORDS if not w.startswith("##")] + ["walks", "acme"])
        tokens.append(word)
        tags.append(f"B-{ENTITIES[word]}" if word in ENTITIES else "O")
        if word == "acme":
            tokens.append("corp")
            tags.append("I-ORG")
    return NerSentence(tuple(tokens), tuple(tags))


def toy_dataset(train: int = 40, dev: int = 12, test: int = 12, seed: int = 0) -> NerDataset:
    """Random toy sentences (3 entity types), deterministic in ``seed``."""
    rng = random.Random(seed)
    make = lambda n: [toy_sentence(rng) for _ in range(n)]  # noqa: E731
    return NerDataset(make(train), make(dev), make(test), name="toy")


def write_toy_data(directory: str | os.PathLike, **sizes: int) -> str:
    """Write :func:`toy_dataset` as ``train.txt``/``dev.txt``/``test.txt`` (``token<TAB>tag``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = toy_dataset(**sizes)
    for name, split in (("train", data.train), ("dev", data.dev), ("test", data.test)):
        text = "\n\n".join(
            "\n".join(f"{t}\t{g}" for t, g in zip(s.tokens, s.tags, strict=True)) for s in split
        )
        (directory / f"{name}.txt").write_text(text + "\n")
    return str(directory)
