"""Where should a pre-norm stack's final norm go in a layer fusion? The measurement behind the rule.

A pre-norm stack (Llama, Gemma, GPT-2, T5, ViT...) carries a residual stream ``z_0 .. z_L`` whose
size grows with depth, and applies its final norm ``F`` once, to ``z_L``, before the head. Four
placements of a parameter-free fusion (Average; ScalarMix is Average with learned weights) are
compared, each fed to the frozen model's own head path:

* ``raw-then-F``:   ``h = F(mean_n z_n)``        (the library's rule: mix the stream, then F)
* ``F-each``:       ``h = mean_n F(z_n)``        (normalise each state as the head would, then mix)
* ``F-each-then-F``: ``h = F(mean_n F(z_n))``
* ``RMS-each-then-F``: ``h = F(mean_n z_n / RMS(z_n))`` (a parameter-free norm of each state first)

and, as the plain head, ``h = F(z_L)``. Printed: the residual stream's RMS per layer, each
rule's effective number of layers in the mix (``1 / Σ share_n²``, share = a layer's part of the
summed norms), the share of the last two layers, the part of ``h``'s energy in its 5 largest
dimensions, how much ScalarMix's scale ``γ`` can still change ``h`` (relative change of ``h``
for ``γ = 1 -> 1.1``), the size of DWAtt's correction against ``h``'s own term at
initialisation, and a frozen-feature linear probe on SST-2 (features: ``h`` at the last token,
as ``*ForSequenceClassification`` pools them; logistic regression, its L2 weight chosen on a
held-out part of the training sentences; accuracy on the validation split), and the frozen LM
head's WikiText-2 perplexity reading ``h`` (Average, and ScalarMix trained a few steps).
Results and the decision: the docstring of ``peft_layerfusion/fusion.py``.

Run (Gemma 3 270M float32 copy; SST-2 and WikiText-2 from the evaluation data; about 20 min each
on 1-2 CPU threads)::

    python benchmarks/prenorm_placement.py --model PATH --sst2 DATA/sst2 --train 1000
    python benchmarks/prenorm_placement.py --model PATH --wikitext DATA/wikitext-2 --threads 1
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from peft_layerfusion.discovery import find_encoder_blocks
from peft_layerfusion.fusion import FusionContext
from peft_layerfusion.methods.dwatt import DWAtt, DWAttConfig

RULES = ("plain F(z_L)", "raw-then-F", "F-each", "F-each-then-F", "RMS-each-then-F")


def unit_rms(z: torch.Tensor) -> torch.Tensor:
    """``z / RMS(z)`` per token: a normalisation without parameters."""
    return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-12)


def read_sst2(path: Path, limit: int | None) -> tuple[list[str], list[int]]:
    with path.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    rows = rows[:limit] if limit else rows
    return [row["sentence"] for row in rows], [int(row["label"]) for row in rows]


class Streams:
    """``z_0 .. z_L`` (raw residual stream) and ``F`` of a causal LM, from hooks on its blocks."""

    def __init__(self, model: torch.nn.Module) -> None:
        located = find_encoder_blocks(model)
        self.norm = model.get_decoder().norm
        self.states: list[torch.Tensor] = []
        for block in located.blocks:
            block.register_forward_pre_hook(
                lambda m, a, k: self.states.append(_first(a, k)), with_kwargs=True
            )
        located.blocks[-1].register_forward_hook(lambda m, a, o: self.states.append(_first((o,), {})))

    def run(self, model: torch.nn.Module, batch: dict) -> list[torch.Tensor]:
        self.states = []
        with torch.no_grad():
            model.model(**batch, use_cache=False)
        return self.states  # L + 1 tensors (batch, seq, d)


def _first(args: tuple, kwargs: dict) -> torch.Tensor:
    value = args[0] if args else kwargs["hidden_states"]
    return value if isinstance(value, torch.Tensor) else value[0]


def fused(
    rule: str, states: list[torch.Tensor], norm: torch.nn.Module, gamma: float = 1.0, weights=None
) -> torch.Tensor:
    """``h`` under ``rule`` for fused layers 1..L: ScalarMix ``γ Σ w_n s_n`` (default: Average)."""
    layers = states[1:]
    if rule == "plain F(z_L)":
        return norm(layers[-1])
    weights = [1.0 / len(layers)] * len(layers) if weights is None else weights
    entering = {"raw-then-F": layers, "RMS-each-then-F": [unit_rms(z) for z in layers]}.get(
        rule, [norm(z) for z in layers]
    )
    mixed = gamma * sum(w * z for w, z in zip(weights, entering, strict=True))
    return mixed if rule == "F-each" else norm(mixed)


def shares(rule: str, states: list[torch.Tensor], norm: torch.nn.Module) -> torch.Tensor:
    """Each fused layer's part of the summed norms of what enters the mix, per token: ``(L,)`` mean."""
    entering = {"raw-then-F": states[1:], "RMS-each-then-F": [unit_rms(z) for z in states[1:]]}.get(
        rule, [norm(z) for z in states[1:]]
    )
    sizes = torch.stack([z.norm(dim=-1).flatten() for z in entering])  # (L, tokens)
    return (sizes / sizes.sum(0, keepdim=True)).mean(1)


def probe_accuracy(
    train: torch.Tensor, y_train: torch.Tensor, test: torch.Tensor, y_test: torch.Tensor
) -> float:
    """Logistic regression (LBFGS), L2 weight chosen on the last fifth of ``train``; accuracy on ``test``."""
    cut = len(train) * 4 // 5

    def fit(x: torch.Tensor, y: torch.Tensor, l2: float) -> torch.Tensor:
        w = torch.zeros(x.shape[1] + 1, requires_grad=True)
        xb = torch.cat([x, torch.ones(len(x), 1)], 1)
        optimizer = torch.optim.LBFGS([w], max_iter=300, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = (
                torch.nn.functional.binary_cross_entropy_with_logits(xb @ w, y) + l2 * w[:-1].square().sum()
            )
            loss.backward()
            return loss

        optimizer.step(closure)
        return w.detach()

    def accuracy(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
        return float(((torch.cat([x, torch.ones(len(x), 1)], 1) @ w > 0).float() == y).float().mean())

    best = max((accuracy(fit(train[:cut], y_train[:cut], l2), train[cut:], y_train[cut:]), l2)
               for l2 in (1e-4, 1e-3, 1e-2, 1e-1))  # fmt: skip
    return accuracy(fit(train, y_train, best[1]), test, y_test)


def last_token_features(model, tokenizer, streams, sentences, batch_size=16) -> dict[str, torch.Tensor]:
    """Per rule, ``h`` at each sentence's last token ``(sentences, d)`` (right padding)."""
    features: dict[str, list[torch.Tensor]] = {rule: [] for rule in RULES}
    tokenizer.padding_side = "right"
    for start in range(0, len(sentences), batch_size):
        batch = tokenizer(sentences[start : start + batch_size], return_tensors="pt", padding=True)
        states = streams.run(model, batch)
        last = batch["attention_mask"].sum(1) - 1  # (batch,)
        rows = torch.arange(len(last))
        with torch.no_grad():
            for rule in RULES:
                features[rule].append(fused(rule, states, streams.norm)[rows, last])
    return {rule: torch.cat(parts) for rule, parts in features.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", required=True, help="folder of a causal LM for from_pretrained (Gemma 3 270M)"
    )
    parser.add_argument("--sst2", type=Path, default=None, help="SST-2 folder (train.tsv, validation.tsv)")
    parser.add_argument("--train", type=int, default=1000, help="training sentences for the probe")
    parser.add_argument("--wikitext", type=Path, default=None, help="WikiText-2 folder (valid.txt, test.txt)")
    parser.add_argument("--steps", type=int, default=32, help="ScalarMix training steps on WikiText-2")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    streams = Streams(model)
    norm = streams.norm

    sentence = "The quick brown fox jumps over the lazy dog, and the dog does not mind at all."
    states = [z.detach() for z in streams.run(model, tokenizer(sentence, return_tensors="pt"))]
    rms = [float(z.pow(2).mean().sqrt()) for z in states]
    peak = [float(z.abs().max()) for z in states]
    print(f"{type(model).__name__}: {len(states) - 1} blocks, d = {states[0].shape[-1]}")
    print("raw residual stream RMS per layer z_0..z_L:", " ".join(f"{v:.1f}" for v in rms))
    print("largest |dimension| per layer:            ", " ".join(f"{v:.0f}" for v in peak))
    print(
        "RMS of F(z_n):                            ",
        " ".join(f"{float(norm(z).pow(2).mean().sqrt()):.1f}" for z in states),
    )
    print()
    print("| rule | effective layers in Average (of L) | last two layers' share | energy in h's top-5 dims | "
          "h change for γ 1 -> 1.1 |")  # fmt: skip
    print("|---|---|---|---|---|")
    with torch.no_grad():
        for rule in RULES[1:]:
            share = shares(rule, states, norm)
            h = fused(rule, states, norm)
            energy = h.pow(2)
            top5 = float((energy.topk(5, dim=-1).values.sum(-1) / energy.sum(-1)).mean())
            change = float((fused(rule, states, norm, 1.1) - h).norm() / h.norm())
            print(f"| {rule} | {1 / float(share.pow(2).sum()):.2f} | {float(share[-2:].sum()):.1%} | "
                  f"{top5:.1%} | {change:.4f} |")  # fmt: skip
        h = norm(states[-1]).pow(2)
        print(
            f"| (plain F(z_L)) | 1 | - | {float((h.topk(5, -1).values.sum(-1) / h.sum(-1)).mean()):.1%} | - |"
        )

    # DWAtt at initialisation: h = q_state + Σ a_n v_n; its correction against the state it corrects.
    located = find_encoder_blocks(model)
    context = FusionContext(model, located, states[0].shape[-1], tuple(range(1, len(states))))
    dwatt = DWAtt(DWAttConfig(), context).eval()
    with torch.no_grad():
        inputs = [
            ("raw z_n", states),
            ("F(z_n)", [norm(z) for z in states]),
            ("z_n/RMS", [unit_rms(z) for z in states]),
        ]
        for name, seen in inputs:
            out = dwatt([s.flatten(0, 1) for s in seen[1:]], _FakeCapture(seen[-1].flatten(0, 1)))
            correction = (out - seen[-1].flatten(0, 1)).norm(dim=-1) / seen[-1].flatten(0, 1).norm(dim=-1)
            print(f"DWAtt at init, inputs {name}: |Σ a_n v_n| / |z_L term| = {float(correction.mean()):.4f}")

    if args.wikitext is not None:
        language_model_section(model, tokenizer, streams, args.wikitext, args.steps)
    if args.sst2 is None:
        return
    train_x, train_y = read_sst2(args.sst2 / "train.tsv", args.train)
    dev_x, dev_y = read_sst2(args.sst2 / "validation.tsv", None)
    train_f = last_token_features(model, tokenizer, streams, train_x)
    dev_f = last_token_features(model, tokenizer, streams, dev_x)
    y_train, y_dev = torch.tensor(train_y, dtype=torch.float32), torch.tensor(dev_y, dtype=torch.float32)
    print(
        f"\nSST-2 linear probe on frozen features ({len(train_x)} train, {len(dev_x)} validation sentences):"
    )
    print("| features | validation accuracy |\n|---|---|")
    for rule in RULES:
        accuracy = probe_accuracy(train_f[rule], y_train, dev_f[rule], y_dev)
        half_width = 1.96 * math.sqrt(accuracy * (1 - accuracy) / len(dev_x))
        print(f"| {rule} | {accuracy:.3f} ± {half_width:.3f} |")


def language_model_section(model, tokenizer, streams, text_dir: Path, steps: int, length: int = 128) -> None:
    """Next-token loss, frozen LM head reading ``h``: Average, and ScalarMix trained ``steps`` steps."""
    chunks = {}
    for split in ("valid", "test"):
        text = " ".join(
            line.strip() for line in (text_dir / f"{split}.txt").open(encoding="utf-8") if line.strip()
        )
        ids = tokenizer(text[:200_000], return_tensors="pt").input_ids[0]
        chunks[split] = [ids[i : i + length].unsqueeze(0) for i in range(0, 16 * length, length)]
    with torch.no_grad():
        cached = {split: [[z.detach() for z in streams.run(model, {"input_ids": c})] for c in parts]
                  for split, parts in chunks.items()}  # fmt: skip
    head, norm = model.get_output_embeddings(), streams.norm

    def loss(
        rule: str, states: list[torch.Tensor], ids: torch.Tensor, logits=None, gamma=None
    ) -> torch.Tensor:
        weights = None if logits is None else torch.softmax(logits, 0)
        h = fused(rule, states, norm, 1.0 if gamma is None else gamma, weights)
        out = head(h)[0, :-1]  # (length - 1, vocab)
        return torch.nn.functional.cross_entropy(out, ids[0, 1:])

    def perplexity(rule: str, logits=None, gamma=None) -> float:
        with torch.no_grad():
            losses = [
                loss(rule, s, c, logits, gamma) for s, c in zip(cached["test"], chunks["test"], strict=True)
            ]
        return math.exp(float(torch.stack(losses).mean()))

    for p in model.parameters():
        p.requires_grad_(False)
    tokens = f"{len(chunks['test'])} x {length} test tokens"
    trained = f"ScalarMix trained {steps} Adam steps on {len(chunks['valid'])} x {length} validation tokens"
    print(f"\nWikiText-2 perplexity of the frozen LM reading h ({tokens}; {trained}):")
    print("| rule | Average | ScalarMix trained | its largest layer weight |\n|---|---|---|---|")
    print(f"| plain F(z_L) | {perplexity('plain F(z_L)'):.2f} | - | - |")
    for rule in RULES[1:]:
        logits = torch.zeros(len(cached["test"][0]) - 1, requires_grad=True)
        gamma = torch.ones((), requires_grad=True)
        optimizer = torch.optim.Adam([logits, gamma], lr=0.1)
        for step in range(steps):
            index = step % len(chunks["valid"])
            optimizer.zero_grad()
            loss(rule, cached["valid"][index], chunks["valid"][index], logits, gamma).backward()
            optimizer.step()
        weights = torch.softmax(logits.detach(), 0)
        top = int(weights.argmax()) + 1
        mixed = perplexity(rule, logits.detach(), gamma.detach())
        print(f"| {rule} | {perplexity(rule):.2f} | {mixed:.2f} | layer {top}: {float(weights.max()):.2f} |")


class _FakeCapture:
    """The one field DWAtt reads from a capture: ``states[-1]``."""

    def __init__(self, last: torch.Tensor) -> None:
        self.states = [last]


if __name__ == "__main__":
    main()
