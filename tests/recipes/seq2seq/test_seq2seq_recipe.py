"""The ``layerfusion seq2seq`` recipe: data building, scoring and a tiny end-to-end run."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch

from layerfusion_recipes.cli import main
from layerfusion_recipes.core.results.records import fingerprint, read_records
from layerfusion_recipes.seq2seq import experiment as seq2seq
from layerfusion_recipes.seq2seq import variants
from layerfusion_recipes.seq2seq.experiment import (
    EOS,
    METHOD_NAMES,
    METRICS,
    PAD,
    TEST_SEED,
    DenoisingData,
    Seq2SeqSettings,
    build_model,
    build_tokenizer,
    corrupt,
    decode,
    denoising_pairs,
    known_words,
    score,
    select_learning_rate,
    sentences_of,
    summarize,
)
from layerfusion_recipes.seq2seq.records import comparison_setup, run_key
from layerfusion_recipes.seq2seq.results import seq2seq_summary
from peft_layerfusion import SurfaceFusionConfig
from peft_layerfusion.registration import SEQ2SEQ_METHODS

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


def test_inserted_words_come_from_the_tokenizer_vocabulary():
    tokenizer = build_tokenizer(["a a a b b c .", "a b c d d e ."])  # e: once, so unknown
    assert known_words(tokenizer) == ["a", "b", ".", "c", "d"]  # id order, no specials
    settings = Seq2SeqSettings(noise=1.0, corruptions="insert")
    rare = ["the zebra sat quietly", "a yak ran far away"]
    pairs = denoising_pairs(rare, settings, seed=0, vocabulary=known_words(tokenizer))
    inserted = [w for noisy, _ in pairs for w in noisy.split()[::2]]  # noise 1: a word before every word
    assert len(inserted) == 9 and set(inserted) <= {"a", "b", ".", "c", "d"}
    own = [w for noisy, _ in denoising_pairs(rare, settings, seed=0) for w in noisy.split()[::2]]
    assert set(own) <= set(" ".join(rare).split())  # default: the sentences' own words


def test_decode_cuts_at_eos_and_keeps_unknown_words():
    tokenizer = build_tokenizer(["the cat sat .", "the cat ran ."])
    ids = tokenizer.encode("the cat flew .").ids
    assert decode(tokenizer, [ids + [EOS, 5, PAD]]) == ["the cat <unk> ."]


def test_score_numbers():
    perfect = score(["a b c d", "e f g h"], ["a b c d", "e f g h"])
    assert perfect == {"exact_match": 100.0, "chrf": pytest.approx(100.0), "bleu": pytest.approx(100.0)}
    half = score(["a b c d", "x y z w"], ["a b c d", "e f g h"])
    assert half["exact_match"] == 50.0 and 0 < half["chrf"] < 100


def test_local_edit_corruptions():
    rng = random.Random(0)
    words = [f"w{i}" for i in range(2000)]
    noisy = corrupt(words, ["x"], 0.3, rng, kinds=["insert", "repeat"])
    inserted = noisy.count("x")
    repeated = sum(a == b for a, b in zip(noisy, noisy[1:], strict=False))
    # each kind has probability 0.15 per word; nothing is lost, and the words keep their order
    assert 220 < inserted < 380 and 220 < repeated < 380
    assert len(noisy) == len(words) + inserted + repeated
    assert [w for i, w in enumerate(noisy) if w != "x" and (i == 0 or noisy[i - 1] != w)] == words
    swapped = corrupt(words, ["x"], 0.3, random.Random(0), kinds=["swap"])
    moved = [i for i, (a, b) in enumerate(zip(swapped, words, strict=True)) if a != b]
    # a swap moves two neighbours and skips the second: 0.3 swaps per 1.3 words, about 460 swaps
    assert all(swapped[i : i + 2] == [words[i + 1], words[i]] for i in moved[::2])
    assert 380 < len(moved) / 2 < 540


@pytest.mark.parametrize(
    "field, value", [("corruptions", "swap,shuffle"), ("corruptions", ""), ("architecture", "t5")]
)
def test_bad_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        Seq2SeqSettings(**{field: value})


@pytest.mark.parametrize("architecture", ["marian", "bart"])
def test_architectures_are_seeded_and_sized(architecture):
    settings = Seq2SeqSettings(architecture=architecture, width=16, layers=1, seed=3)
    first, second = build_model(50, settings), build_model(50, settings)
    assert first.config.model_type == architecture and first.config.d_model == 16
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters(), strict=True))


def test_dev_is_held_out_from_training_and_fixed(tmp_path):
    settings = Seq2SeqSettings(train_sentences=1000, dev_sentences=20, test_sentences=10)
    train_text = synthetic_text(60, 0).splitlines()
    data = DenoisingData.build(train_text, synthetic_text(8, 1).splitlines(), settings)
    pieces = sentences_of(train_text, settings.max_words)
    assert data.train == pieces[:-20] and len(data.dev_pairs) == 20 and len(data.test_pairs) == 10
    again = DenoisingData.build(train_text, synthetic_text(8, 1).splitlines(), settings)
    assert again.dev_pairs == data.dev_pairs and again.train_pairs(0, 1) == data.train_pairs(0, 1)
    assert data.train_pairs(0, 0) != data.train_pairs(1, 0)  # each seed its own corruption
    with pytest.raises(ValueError, match="dev_sentences=500"):
        DenoisingData.build(train_text, synthetic_text(8, 1).splitlines(), Seq2SeqSettings())


def test_learning_rate_selection_uses_dev_only():
    runs = [
        {"method": "m", "seed": 0, "learning_rate": 1e-3, "dev": {"exact_match": 5.0, "chrf": 70.0}},
        {"method": "m", "seed": 0, "learning_rate": 3e-3, "dev": {"exact_match": 5.0, "chrf": 71.0}},
        {"method": "m", "seed": 0, "learning_rate": 1e-2, "dev": {"exact_match": 4.0, "chrf": 90.0}},
        {"method": "m", "seed": 1, "learning_rate": 1e-2, "dev": {"exact_match": 9.0, "chrf": 90.0}},
    ]
    assert select_learning_rate(runs, "m", 0) == 3e-3  # EM tie broken by chrF; seed 1 not looked at
    with pytest.raises(ValueError, match="method='other'"):
        select_learning_rate(runs, "other", 0)


def test_summary_means_and_paired_differences():
    table = {("none", 0): 10.0, ("none", 1): 20.0, ("none", 2): 30.0, ("x", 0): 12.0, ("x", 1): 21.0}
    table[("x", 2)] = 33.0
    runs = [
        {"method": m, "seed": s, "exact_match": v, "chrf": 2 * v, "bleu": v} for (m, s), v in table.items()
    ]
    none, x = summarize(runs, ["none", "x"])
    assert none["exact_match"] == [20.0, pytest.approx(24.8414, abs=1e-3)]  # t(0.975, 2) * 10 / sqrt(3)
    assert "vs_none" not in none and x["seeds"] == [0, 1, 2]
    # differences 2, 1, 3: mean 2, sd 1
    assert x["vs_none"]["exact_match"] == [2.0, pytest.approx(4.302653 / 3**0.5, abs=1e-5)]
    assert x["vs_none"]["chrf"][0] == 4.0


def test_end_to_end_run_writes_records_and_resumes(tmp_path, monkeypatch):
    end_to_end(tmp_path, monkeypatch)


def end_to_end(tmp_path, monkeypatch):
    (tmp_path / "valid.txt").write_text(synthetic_text(60, 0))
    (tmp_path / "test.txt").write_text(synthetic_text(8, 1))
    output = tmp_path / "out"
    methods = ["none", "surface_soft", "encoder_fusion"]
    small = "--train-sentences 64 --dev-sentences 10 --test-sentences 12 --epochs 2 --width 16 --layers 1"
    grid = ["--seeds", "0", "1", "--lr", "1e-3", "3e-3", "--beams", "2", "--threads", "1"]
    paths = ["--data", str(tmp_path), "--output", str(output)]
    code = main(["seq2seq", *paths, "--methods", *methods, *small.split(), *grid])
    assert code == 0
    results = json.loads((output / "results.json").read_text())
    assert results["complete"] and results["seeds"] == [0, 1]
    # two learning rates on seed 0, the selected one on seed 1
    assert [(r["method"], r["seed"]) for r in results["runs"]] == [(m, s) for m in methods for s in (0, 0, 1)]
    for method in methods:
        selected = results["selected_learning_rate"][method]
        assert selected == select_learning_rate(results["runs"], method, 0)
        assert [r["learning_rate"] for r in results["runs"] if r["method"] == method][2] == selected
    for record in results["runs"]:
        assert 0.0 <= record["exact_match"] <= 100.0 and 0.0 <= record["dev"]["chrf"] <= 100.0
    rows = {row["method"]: row for row in results["summary"]}
    assert rows["none"]["seeds"] == [0, 1] and set(rows["encoder_fusion"]["vs_none"]) == {
        "exact_match",
        "chrf",
        "bleu",
    }
    # copy_input: the corrupted sentence scored against the original, recomputed independently
    settings = Seq2SeqSettings(test_sentences=12)
    train = sentences_of((tmp_path / "valid.txt").read_text().splitlines(), settings.max_words)[:-10][:64]
    words = known_words(build_tokenizer(train, settings.vocab_size))
    test = sentences_of((tmp_path / "test.txt").read_text().splitlines(), settings.max_words)[:12]
    pairs = denoising_pairs(test, settings, TEST_SEED, words)
    unchanged = 100.0 * sum(c == o for c, o in pairs) / len(pairs)
    assert results["copy_input"]["test"]["exact_match"] == pytest.approx(unchanged)
    assert not list(output.glob("*.tmp"))  # written atomically

    records = read_records(output / "results.jsonl")  # one per run, keyed by its settings
    assert records == results["runs"] and len({r["key"] for r in records}) == 9
    setup = comparison_setup(results)
    assert [r["key"] for r in records] == [
        run_key(r["method"], r["seed"], r["learning_rate"], setup) for r in results["runs"]
    ]
    assert records[0]["key"] == f"none|0|lr=0.001|{setup}"

    # Resuming: the saved runs are reused, only the new seed is trained
    trained = []
    real_run_one = seq2seq.run_one
    monkeypatch.setattr(seq2seq, "run_one", lambda *a: trained.append(a[1:]) or real_run_one(*a))
    assert main(["seq2seq", *paths, "--methods", *methods, *small.split(), *grid[:3], "2", *grid[3:]]) == 0
    assert trained == [
        (m, 2, json.loads((output / "results.json").read_text())["selected_learning_rate"][m])
        for m in methods
    ]
    rerun = json.loads((output / "results.json").read_text())
    assert [r for r in rerun["runs"] if r["seed"] < 2] == results["runs"] and len(rerun["runs"]) == 12
    assert read_records(output / "results.jsonl") == [*records, *(r for r in rerun["runs"] if r["seed"] == 2)]
    return output, [*paths, "--methods", *methods, *small.split(), *grid[:3], "2", *grid[3:]]


def test_a_killed_comparison_resumes_only_the_missing_runs(tmp_path, monkeypatch, capsys):
    (tmp_path / "valid.txt").write_text(synthetic_text(60, 0))
    (tmp_path / "test.txt").write_text(synthetic_text(8, 1))
    small = "--train-sentences 32 --dev-sentences 8 --test-sentences 8 --epochs 1 --width 16 --layers 1"
    argv = ["seq2seq", "--data", str(tmp_path), "--output", str(tmp_path / "out"), *small.split()]
    argv += ["--methods", "none", "surface_hard", "--seeds", "0", "1", "--threads", "1"]
    started, real_run_one = [], seq2seq.run_one

    def killed_at_the_third(*args):
        started.append(args[1:3])
        if len(started) == 3:
            raise KeyboardInterrupt
        return real_run_one(*args)

    monkeypatch.setattr(seq2seq, "run_one", killed_at_the_third)
    assert main(argv) == 130  # Ctrl-C: one line, 128 + SIGINT
    done = read_records(tmp_path / "out" / "results.jsonl")
    assert [(r["method"], r["seed"]) for r in done] == [("none", 0), ("none", 1)]
    assert not (tmp_path / "out" / "results.json").exists()  # written when the comparison completes
    started.clear()
    assert main(argv) == 0
    assert started == [("surface_hard", 0), ("surface_hard", 1)]  # the two finished runs are not redone
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["complete"] and results["runs"][:2] == done and len(results["runs"]) == 4


def test_comparison_inserts_only_known_words():
    rare = " ".join(f"once{i} rare{i} word{i} here{i} ." for i in range(40))  # each word seen once: <unk>
    text = [*synthetic_text(60, 0).splitlines(), rare]
    settings = Seq2SeqSettings(dev_sentences=40, test_sentences=10, noise=1.0, corruptions="insert")
    data = DenoisingData.build(text, synthetic_text(8, 1).splitlines(), settings)
    sources = decode(data.tokenizer, [source for source, _ in data.dev_pairs])
    inserted = [word for source in sources for word in source.split()[::2]]  # a word before every word
    assert len(inserted) > 100 and "<unk>" not in inserted  # drawn from all corpus words: mostly <unk>


def test_the_compared_models_derive_from_the_registry(monkeypatch):
    """The plain model, then every seq2seq method of the registry in its declared variants; a newly
    registered seq2seq method joins the comparison under its own name, with its defaults."""
    configs = seq2seq.method_configs()
    assert list(configs) == ["none", "encoder_fusion", "surface_hard", "surface_soft"]
    assert configs["none"] is None
    assert {type(make()) for make in configs.values() if make} == {m.config_cls for m in SEQ2SEQ_METHODS}
    assert configs["surface_hard"]().fusion == "hard" and configs["surface_soft"]().fusion == "soft"
    new = SimpleNamespace(name="new_fusion", config_cls=type("NewConfig", (), {}))
    monkeypatch.setattr(variants, "SEQ2SEQ_METHODS", (*SEQ2SEQ_METHODS, new))
    assert list(seq2seq.method_configs())[-1] == "new_fusion"


def test_a_variant_whose_options_change_gets_another_key(monkeypatch):
    """The run name ``surface_hard`` alone does not say its λ: a record of λ = 0.8 must not be served
    for λ = 0.5, nor for a changed config default; each variant's key carries its options."""
    before = {name: run_key(name, 0, 3e-3, "s") for name in seq2seq.METHOD_NAMES}
    hard = fingerprint(variants.variant_options("surface_hard"))
    assert before["surface_hard"] == f"surface_hard|0|lr=0.003|s|defaults={hard}"
    assert before["none"] == "none|0|lr=0.003|s"
    hard = {**variants.VARIANTS[SurfaceFusionConfig]["surface_hard"], "fusion_lambda": 0.5}
    changed = {**variants.VARIANTS[SurfaceFusionConfig], "surface_hard": hard}
    monkeypatch.setattr(variants, "VARIANTS", {**variants.VARIANTS, SurfaceFusionConfig: changed})
    after = {name: run_key(name, 0, 3e-3, "s") for name in seq2seq.METHOD_NAMES}
    assert after["surface_hard"].startswith("surface_hard|0|lr=0.003|s|defaults=")
    assert {name: key for name, key in after.items() if name != "surface_hard"} == {
        name: key for name, key in before.items() if name != "surface_hard"
    }
    monkeypatch.undo()
    monkeypatch.setattr(variants, "config_defaults", lambda cls: {"attention_dropout": 0.0})  # a new default
    assert run_key("surface_soft", 0, 3e-3, "s") != before["surface_soft"]


def test_an_unknown_method_is_one_line_before_any_data_is_read(tmp_path, capsys):
    assert main(["seq2seq", "--data", str(tmp_path), "--methods", "none", "surface"]) == 2  # no valid.txt
    error = capsys.readouterr().err
    assert error.startswith("layerfusion seq2seq: error: --methods: unknown ['surface']; allowed: none, ")


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--epochs", "0", "--epochs 0: must be >= 1"),  # trained nothing, then scored it
        ("--train-sentences", "0", "--train-sentences 0: must be >= 1"),
        ("--beams", "0", "--beams 0: must be >= 1"),
        ("--noise", "1.5", "--noise 1.5: must be in [0, 1]"),  # a probability
        ("--warmup", "1", "--warmup 1.0: must be in [0, 1)"),
        ("--dropout", "-0.1", "--dropout -0.1: must be in [0, 1)"),
        ("--init-std", "0", "--init-std 0.0: must be > 0"),
    ],
)
def test_degenerate_settings_are_one_line_before_any_data_is_read(tmp_path, capsys, option, value, message):
    assert main(["seq2seq", "--data", str(tmp_path), option, value]) == 2  # an empty folder: no data read
    assert capsys.readouterr().err.strip() == f"layerfusion seq2seq: error: {message}"


@pytest.mark.parametrize("option, value", [("--lr", "0"), ("--threads", "0")])
def test_a_zero_learning_rate_or_thread_count_is_refused_at_parse_time(tmp_path, capsys, option, value):
    with pytest.raises(SystemExit) as exit_info:
        main(["seq2seq", "--data", str(tmp_path), option, value])
    assert exit_info.value.code == 2 and f"argument {option}: must be" in capsys.readouterr().err


def test_the_summary_holds_each_seed_s_scores_and_pairs_every_method_with_none():
    def run(method, seed, em):
        scores = {"exact_match": em, "chrf": 80.0 + seed, "bleu": 70.0}
        return {"method": method, "seed": seed, "learning_rate": 0.003, **scores, "dev": scores}

    results = {
        "complete": True,
        "settings": {"epochs": 16, "architecture": "marian"},
        "train_file": "/d/wikitext-2/valid.txt",
        "lr": {"none": [0.003], "surface_hard": [0.003]},
        "selected_learning_rate": {"none": 0.003, "surface_hard": 0.003},
        "copy_input": {
            "test": dict(zip(METRICS, (25.0, 88.0, 81.0), strict=True)),
            "dev": dict.fromkeys(METRICS, 1.0),
        },
        "runs": [run(m, s, em + s) for m, em in (("none", 40.0), ("surface_hard", 42.0)) for s in (1, 0)],
    }
    summary = seq2seq_summary(results, name="seq2seq", commands=["layerfusion seq2seq"])
    methods = summary["cells"][0]["methods"]
    assert list(methods) == ["copy_input", *[m for m in METHOD_NAMES if m in ("none", "surface_hard")]]
    assert methods["surface_hard"]["trials"] == [0, 1] and methods["surface_hard"]["test"] == [42.0, 43.0]
    assert methods["none"]["scores"]["chrf"]["test"] == [80.0, 81.0]
    assert methods["copy_input"]["test"] == [25.0] and "lr" not in methods["copy_input"]
    assert summary["pairs"] == [["surface_hard", "none"]] and summary["data"]["name"] == "wikitext-2"
    with pytest.raises(ValueError, match="has not finished"):
        seq2seq_summary({**results, "complete": False}, name="seq2seq", commands=[])
