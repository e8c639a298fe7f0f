"""The ``layerfusion seq2seq`` recipe: data building, scoring and a tiny end-to-end run."""

from __future__ import annotations

import json
import random

import pytest
from layerfusion_recipes.cli import main
from layerfusion_recipes.seq2seq import (
    EOS,
    PAD,
    Seq2SeqSettings,
    build_tokenizer,
    corrupt,
    decode,
    denoising_pairs,
    score,
    sentences_of,
)

WORDS = "the a cat dog sat ran on under mat tree red big small house".split()


def synthetic_text(paragraphs: int, seed: int) -> str:
    rng = random.Random(seed)
    lines = [" = Heading = "]
    for _ in range(paragraphs):
        lines.append(" ".join(" ".join(rng.choices(WORDS, k=rng.randint(4, 7))) + " ." for _ in range(3)))
    return "\n".join(lines) + "\n"


def test_sentences_skip_headings_and_long_ones_are_cut_into_pieces():
    text = [" = Title = ", "one two three four . one two . a b c d e f g h i j k ."]
    # "one two ." is too short; the 12-word sentence gives two 6-word pieces and a 0-word rest
    assert sentences_of(text, max_words=6) == ["one two three four .", "a b c d e f", "g h i j k ."]
    assert sentences_of(text, max_words=5) == ["one two three four .", "a b c d e", "f g h i j"]


def test_tokenizer_keeps_the_most_frequent_words():
    tokenizer = build_tokenizer(["a a a b b c .", "a b c d d e ."], vocab_size=2)  # a: 4, b: 3, others <= 2
    assert tokenizer.encode("a b c d").tokens == ["a", "b", "<unk>", "<unk>"]


def test_corruption_rates():
    rng = random.Random(0)
    words = [f"w{i}" for i in range(2000)]
    assert corrupt(words, ["x"], 0.0, rng) == words
    noisy = corrupt(words, ["x"], 0.3, rng)
    replaced = noisy.count("x")
    deleted = len(words) - len(noisy)
    # each action has probability 0.3 / 3 = 0.1 per word (swaps also move a neighbour)
    assert 120 < replaced < 280 and 120 < deleted < 280


def test_decode_cuts_at_eos_and_keeps_unknown_words():
    tokenizer = build_tokenizer(["the cat sat .", "the cat ran ."])
    ids = tokenizer.encode("the cat flew .").ids
    assert decode(tokenizer, [ids + [EOS, 5, PAD]]) == ["the cat <unk> ."]


def test_score_numbers():
    perfect = score(["a b c d", "e f g h"], ["a b c d", "e f g h"])
    assert perfect == {"exact_match": 100.0, "chrf": pytest.approx(100.0), "bleu": pytest.approx(100.0)}
    half = score(["a b c d", "x y z w"], ["a b c d", "e f g h"])
    assert half["exact_match"] == 50.0 and 0 < half["chrf"] < 100


def test_end_to_end_run_writes_results(tmp_path):
    (tmp_path / "valid.txt").write_text(synthetic_text(60, 0))
    (tmp_path / "test.txt").write_text(synthetic_text(8, 1))
    output = tmp_path / "out"
    methods = ["vanilla", "surface_soft", "encoder_fusion"]
    small = "--train-sentences 64 --test-sentences 12 --epochs 2 --width 16 --layers 1 --beams 2 --threads 1"
    paths = ["--data", str(tmp_path), "--output", str(output)]
    code = main(["seq2seq", *paths, "--methods", *methods, *small.split()])
    assert code == 0
    results = json.loads((output / "results.json").read_text())
    assert [r["method"] for r in results["records"]] == [*methods, "copy_input"]
    for record in results["records"]:
        assert 0.0 <= record["exact_match"] <= 100.0 and 0.0 <= record["chrf"] <= 100.0
    # copy_input: the corrupted sentence scored against the original, recomputed independently
    settings = Seq2SeqSettings(test_sentences=12)
    test = sentences_of((tmp_path / "test.txt").read_text().splitlines(), settings.max_words)[:12]
    pairs = denoising_pairs(test, settings, settings.seed + 1)
    unchanged = 100.0 * sum(c == o for c, o in pairs) / len(pairs)
    assert results["records"][-1]["exact_match"] == pytest.approx(unchanged)
    assert not list(output.glob("*.tmp"))  # written atomically
