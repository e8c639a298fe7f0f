"""Each method against the best single layer chosen on dev, paired by trial: the bar a fusion must clear.

For one sweep's runs and its layer probes (``--probe-layers`` or ``--probe-start``), per (shots, max
epochs), one Markdown table (:func:`best_layer_markdown`):

- each method at the LR selected on dev (the mean best dev score over trials, the sweep's rule), its
  test score mean ± 95% t-CI over trials;
- **best layer (dev)**: per trial, the probe (layer, feature kind) with the best dev score in that trial
  (:func:`~layerfusion_recipes.core.probes.probes.best_single_layer`; its penalty chosen by cross-validation
  on
  the trial's sample), scored on test;
- the paired difference of each method minus the best layer, and minus the plain head, over the trials
  both have (bold: the interval excludes 0);
- its mean dev difference to the best layer (each trial's best dev score at the selected LR minus the
  best layer's: what a choice among methods may read);
- **guarded**: the method kept in a trial only where its dev score beats the best layer's by more than
  one standard error of the layer's dev score (the one-standard-error rule,
  :func:`~peft_layerfusion.probing.keep_fusion`), else the best layer
  (:func:`~layerfusion_recipes.core.probes.probes.guarded`), minus the best layer, and in how many trials the
  method was kept.

A run made with ``method_options`` (e.g. ``{mixing_lr_multiplier: 10}``) is its own row, labelled
``method (option=value)``. No choice reads test: LR, epoch, layer and the guard are chosen on dev.
Scores in points (0-100).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from peft_layerfusion.names import PLAIN_HEAD

from ..core.probes.probes import UNIT_RMS, best_per_trial, guarded, probe_trials
from ..core.results.selection import dev_score, dev_size, select_lr, test_score
from ..core.results.stats import mean_ci, paired_mean_ci
from .plot import setup_label, variant_text

BEST_LAYER = "best layer (dev)"
PLAIN = PLAIN_HEAD
Scores = dict[int, float]  # {trial: score in points}


def run_label(record: dict[str, Any]) -> str:
    """A record's row: its method, with its ``method_options`` where it has any, and the number of
    probed blocks it fuses where the probes chose them (``--probe-fuse``).

    Example:
        >>> run_label({"method": "layer_mix", "method_options": {"mixing_lr_multiplier": 10}})
        'layer_mix (mixing_lr_multiplier=10)'
        >>> run_label({"method": "average", "probe_layers": [10, 11, 12]})
        'average (the 3 best probed blocks)'
    """
    variant = variant_text(record)
    return f"{record['method']} ({variant})" if variant else record["method"]


def method_scores(records: Sequence[dict[str, Any]]) -> dict[str, tuple[float, Scores, Scores]]:
    """``{label: (selected LR, {trial: test score}, {trial: dev score})}`` (points) of one (shots, max
    epochs) of a sweep; labels as :func:`run_label`.

    Example:
        >>> runs = [{"method": "none", "lr": lr, "trial": 0, "dev_f1": dev, "test_f1": 0.5}
        ...         for lr, dev in ((0.01, 0.4), (0.1, 0.6))]
        >>> method_scores(runs)
        {'none': (0.1, {0: 50.0}, {0: 60.0})}
    """
    by_method: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_method[run_label(record)].append(record)
    scores = {}
    for method, runs in by_method.items():
        lr = select_lr(runs).lr
        chosen = [r for r in runs if r["lr"] == lr]
        scores[method] = (
            lr,
            {r["trial"]: 100 * test_score(r) for r in chosen},
            {r["trial"]: 100 * dev_score(r) for r in chosen},
        )
    return scores


def best_layer_scores(probes: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """``{trial: best_single_layer(...)}`` of the probe records of one (shots, max epochs)."""
    return {trial: best for (_, _, trial), best in best_per_trial(probes).items()}


def guarded_scores(
    test: Scores, dev: Scores, best: dict[int, dict[str, Any]], size: int
) -> tuple[Scores, list[int]]:
    """A method's test scores guarded per trial by the trial's best layer (points; the guard:
    :func:`~layerfusion_recipes.core.probes.probes.guarded` over ``size`` dev units), and the trials
    where the method was kept; over the trials both have.

    Example:
        >>> best = {0: {"dev": 0.8, "test": 0.7}, 1: {"dev": 0.8, "test": 0.7}}
        >>> guarded_scores({0: 75.0, 1: 90.0}, {0: 82.0, 1: 81.0}, best, 1000)  # trial 1: within one SE
        ({0: 75.0, 1: 70.0}, [0])
    """
    kept, scores = [], {}
    for trial in sorted(set(test) & set(dev) & set(best)):
        own = {**best[trial], "test": 100 * best[trial]["test"]}  # dev a fraction, as keep_fusion reads it
        scores[trial], keep = guarded(dev[trial] / 100, test[trial], own, size)
        kept += [trial] if keep else []
    return scores, kept


def difference(own: Scores, base: Scores) -> str:
    """The paired difference ``own - base`` over the trials both have, as ``+m ± h`` (bold where the
    interval excludes 0); ``+m (n=1)`` for one shared trial (no interval), ``-`` for none.

    Example:
        >>> difference({0: 60.0, 1: 62.0, 2: 61.0}, {0: 50.0, 1: 51.0, 2: 50.5})
        '**+10.5 ± 1.2**'
        >>> difference({0: 60.0}, {0: 50.0}), difference({0: 60.0}, {1: 50.0})
        ('+10.0 (n=1)', '-')
    """
    paired = paired_mean_ci(own, base)
    if paired is None:
        return "-"
    if paired.n == 1:
        return f"{paired.mean:+.1f} (n=1)"
    text = f"{paired.mean:+.1f} ± {paired.half_width:.1f}"
    return f"**{text}**" if paired.resolved else text


def cell_table(
    cell: tuple[int, int], records: list[dict], probes: list[dict], named: str = ""
) -> tuple[str, dict[str, Any]]:
    """The Markdown table of one (shots, max epochs) and its numbers (``{row: {...}}``); ``named`` follows
    its title (which setup, where the file has several)."""
    scores = method_scores(records)
    best = best_layer_scores(probes)
    best_test = {trial: 100 * found["test"] for trial, found in best.items()}
    best_dev = {trial: 100 * found["dev"] for trial, found in best.items()}
    plain = scores.get(PLAIN, (None, {}, {}))[1]
    size = dev_size(records) if scores else 0  # the guard's dev units (no runs: no guard to apply)
    lines = [
        f"**N={cell[0]}, max {cell[1]} epochs**{named}: best layer per trial on dev: "
        + ", ".join(f"trial {t}: {probe_label(found)}" for t, found in sorted(best.items())),
        "",
        "| method | test (mean ± CI) | LR | minus best layer (paired) | minus plain head (paired) "
        "| dev minus best layer | guarded, minus best layer (kept) |",
        "|---|---|---|---|---|---|---|",
    ]
    mean, half = mean_ci(list(best_test.values()))
    lines.append(f"| {BEST_LAYER} | {mean:.1f} ± {half:.1f} (n={len(best_test)}) | per trial | | "
                 f"{difference(best_test, plain)} | | |")  # fmt: skip
    numbers: dict[str, Any] = {
        BEST_LAYER: {
            "trials": best_test,
            "dev": best_dev,
            "layers": {t: b["layer"] for t, b in best.items()},
            "features": {t: b.get("features") for t, b in best.items()},
            "penalties": {t: b.get("penalty") for t, b in best.items()},
        }
    }
    for method, (lr, trials, dev) in scores.items():
        mean, half = mean_ci(list(trials.values()))
        shared = sorted(set(dev) & set(best_dev))
        dev_gap = sum(dev[t] - best_dev[t] for t in shared) / len(shared) if shared else float("nan")
        kept_scores, kept = guarded_scores(trials, dev, best, size)
        lines.append(
            f"| {method} | {mean:.1f} ± {half:.1f} (n={len(trials)}) | {lr:g} | "
            f"{difference(trials, best_test)} | {'' if method == PLAIN else difference(trials, plain)} "
            f"| {dev_gap:+.1f} | {difference(kept_scores, best_test)} ({len(kept)}/{len(kept_scores)}) |"
        )
        numbers[method] = {
            "lr": lr,
            "trials": trials,
            "dev": dev,
            "dev_minus_best_layer": dev_gap,
            "guarded": kept_scores,
            "kept": len(kept),
            "kept_trials": kept,
        }
    edge = edge_trials(best)
    if edge:
        lines += [
            "",
            f"⚠ the best layer's penalty is at the end of its grid in trial(s) {edge} (it grew as far as "
            "the probes grow a grid: the best may lie beyond)",
        ]
    return "\n".join(lines), numbers


def probe_label(found: dict[str, Any]) -> str:
    """A best probe (:func:`~layerfusion_recipes.core.probes.probes.best_single_layer`) as text: its block,
    its
    penalty (λ) and, for the unit-RMS kind, ``on z/rms(z)``.

    Example:
        >>> plain, unit = {"layer": 5, "penalty": 0.01}, {"layer": 3, "penalty": 1, "features": "rms"}
        >>> probe_label(plain), probe_label(unit)
        ('z_5 λ 0.01', 'z_3 λ 1 on z/rms(z)')
    """
    own = f"z_{found['layer']} λ {found['penalty']:.3g}"
    return f"{own} on z/rms(z)" if found.get("features") == UNIT_RMS else own


def edge_trials(best: dict[int, dict[str, Any]]) -> str:
    """The trials whose best layer's penalty is still at an end of its grown grid (its best may lie
    beyond), as text (``"1, 3"``); ``""`` for none.

    Example:
        >>> edge_trials({0: {"on_edge": False}, 1: {"on_edge": True}, 2: {"on_edge": True}})
        '1, 2'
    """
    return ", ".join(str(t) for t, found in sorted(best.items()) if found["on_edge"])


def union_probes(groups: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The probe records of several sweeps of one grid (the same samples), one per (setup, shots, max
    epochs, trial, feature kind), for the (shots, max epochs, trial) of the first group only: the first
    group's where two have it; a later group fills in the kinds the first lacks. Its other trials are
    not the first's.

    The first group's records keep their setups (a file probed again under a new setup holds both, and a
    report reads each with its own runs). A later group's record joins each setup the first group has
    for its trial, as that setup's (from the later group's newest setup of the trial:
    :func:`~layerfusion_recipes.core.probes.probes.probe_trials`).

    Example:
        >>> old = [{"shots": 8, "epochs": 5, "trial": 0, "features": "none", "from": "old"}]
        >>> new = [{**old[0], "from": "new"}, {**old[0], "features": "rms", "from": "new"},
        ...        {**old[0], "trial": 1, "features": "rms", "from": "new"}]
        >>> [(p["trial"], p["features"], p["from"]) for p in union_probes([old, new])]
        [(0, 'none', 'old'), (0, 'rms', 'new')]
    """
    if not groups:
        return []
    found: dict[tuple, dict[str, Any]] = {}
    setups: dict[tuple, dict[Any, None]] = {}  # (shots, epochs, trial): the first group's setups, in order
    for record in groups[0]:
        found.setdefault(_candidate(record), record)
        setups.setdefault(_trial_of(record), {})[record.get("setup")] = None
    for group in groups[1:]:
        for trial, records in probe_trials(group).items():
            for setup in setups.get(trial, {}):
                for record in ({**record, "setup": setup} for record in records):
                    found.setdefault(_candidate(record), record)
    return list(found.values())


def _trial_of(record: dict[str, Any]) -> tuple[int, int, int]:
    return record["shots"], record["epochs"], record["trial"]


def _candidate(record: dict[str, Any]) -> tuple:
    """What one probe record is a candidate of the best layer for: its setup, trial and feature kind."""
    return record.get("setup"), *_trial_of(record), record["features"]


def best_layer_markdown(
    records: Sequence[dict[str, Any]], probes: Sequence[dict[str, Any]]
) -> tuple[str, dict[str, Any]]:
    """The tables of every (shots, max epochs) the probes have, FE runs only, and their numbers
    (``{"N=8 epochs=30": {row: {...}}}``); empty without probes. Where a (shots, max epochs) has probes of
    several setups (its data, model or settings changed, and it ran again), each setup gets its own table
    of its own runs against its own probes (``{"N=8 epochs=30 setup=3f2a": ...}``).

    Example:
        >>> cell = {"shots": 8, "epochs": 25, "setup": "s", "metric": "f1"}
        >>> def probe(trial, scores):  # a trial's probes of one kind: (dev, test) of layers 1, 2
        ...     layers = [{"layer": n, "penalty": 0.1, "penalty_on_edge": False, "dev_f1": d, "test_f1": t}
        ...               for n, (d, t) in enumerate(scores, 1)]
        ...     return {**cell, "trial": trial, "features": "none", "layers": layers}
        >>> def run(trial, dev, test):  # a LayerMix run on 1000 dev entities
        ...     return {**cell, "method": "layer_mix", "regime": "fe", "trial": trial, "lr": 0.01,
        ...             "dev_f1": dev, "test_f1": test, "dev_entities": 1000}
        >>> probes = [probe(0, [(0.5, 0.5), (0.7, 0.6)]), probe(1, [(0.8, 0.7), (0.6, 0.6)])]
        >>> text, numbers = best_layer_markdown([run(0, 0.75, 0.65), run(1, 0.81, 0.72)], probes)
        >>> print(text.splitlines()[0])
        **N=8, max 25 epochs**: best layer per trial on dev: trial 0: z_2 λ 0.1, trial 1: z_1 λ 0.1
        >>> numbers["N=8 epochs=25"]["layer_mix"]["kept"]  # trial 0: +5 points on dev, beyond one SE (1.4)
        1
    """
    texts, out = [], {}
    for (shots, epochs, setup), several, runs, own in _probe_cells(records, probes):
        named = f" {setup_label(setup)}" if several else ""  # runs of two setups never pair
        text, numbers = cell_table((shots, epochs), runs, own, named)
        texts.append(text)
        out[f"N={shots} epochs={epochs}" + (f" setup={setup}" if named else "")] = numbers
    return "\n\n".join(texts), out


def _probe_cells(
    records: Sequence[dict[str, Any]], probes: Sequence[dict[str, Any]]
) -> Iterator[tuple[tuple[int, int, Any], bool, list[dict[str, Any]], list[dict[str, Any]]]]:
    """Per (shots, max epochs, setup) the probes have, in order: whether that (shots, max epochs) has
    several setups, its FE runs and its probes."""
    fe = [r for r in records if r.get("regime") == "fe"]
    for shots, epochs in sorted({(p["shots"], p["epochs"]) for p in probes}):
        here = [p for p in probes if (p["shots"], p["epochs"]) == (shots, epochs)]
        setups = list(dict.fromkeys(p.get("setup") for p in here))  # file order: the oldest first
        for setup in setups:
            runs = [r for r in fe if (r["shots"], r["epochs"], r.get("setup")) == (shots, epochs, setup)]
            yield (shots, epochs, setup), len(setups) > 1, runs, [p for p in here if p.get("setup") == setup]


def best_layer_cells(
    records: Sequence[dict[str, Any]], probes: Sequence[dict[str, Any]]
) -> dict[tuple[int, int, Any], dict[str, Any]]:
    """The numbers of :func:`best_layer_markdown` by ``(shots, max epochs, setup)``: per row its LR,
    per-trial test and dev scores, its guarded scores and the trials it was kept in; the best layer's
    block, feature kind and penalty per trial.

    Example:
        >>> probe = {"shots": 8, "epochs": 5, "trial": 0, "features": "none", "metric": "f1", "setup": "a",
        ...          "layers": [{"layer": 2, "penalty": 0.1, "penalty_on_edge": False, "dev_f1": 0.6,
        ...                      "test_f1": 0.5}]}
        >>> best_layer_cells([], [probe])[8, 5, "a"][BEST_LAYER]["layers"]
        {0: 2}
    """
    return {cell: cell_table(cell[:2], runs, own)[1] for cell, _, runs, own in _probe_cells(records, probes)}


def best_layer_section(
    records: Sequence[dict[str, Any]],
    probes: Sequence[dict[str, Any]],
    heading: str = "## Against the best single layer chosen on dev",
) -> str:
    """``table.md``'s section of :func:`best_layer_markdown` under ``heading`` (with what its columns
    are); ``""`` without probes or FE runs.

    Example:
        >>> best_layer_section([], [])
        ''
    """
    if not any(record.get("regime") == "fe" for record in records):
        return ""
    text, _ = best_layer_markdown(records, probes)
    if not text:
        return ""
    return (
        f"{heading}\n\nEach method at its LR selected on dev against, per trial, the layer probe with the "
        "best dev score (its layer and feature kind, z or z/rms(z), chosen in that trial; its penalty λ by "
        "cross-validation on the trial's sample), scored on test; paired differences over trials (bold: the "
        "95% interval excludes 0). Guarded: the method kept in a trial only where its dev score beats that "
        "layer's by more than one standard error of the layer's dev score, else the layer; (kept) counts the "
        "trials it was kept.\n\n"
        f"{text}\n"
    )
