"""The tests' one shared helper module: tiny random models (built from configs, no download), a tiny
BERT + WordPiece tokenizer saved to disk, a toy NER corpus and a small sweep's records (for the
recipes' tests), fixtures."""

from __future__ import annotations

import copy
import gc
import importlib
import json
import os
import random
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from peft import PeftModel, get_peft_model
from torch import nn
from transformers import BertConfig, BertForTokenClassification

import peft_layerfusion  # noqa: F401  (registers the PEFT types)
from layerfusion_recipes.data.readers import NerDataset, NerSentence
from peft_layerfusion import count_hooks
from peft_layerfusion.config import LayerFusionConfig
from peft_layerfusion.fusion import FusionModule
from peft_layerfusion.layer import fusion_layer_of
from peft_layerfusion.registration import ENCODER_METHODS

# The test matrices derive from the registry, never from a list of their own.
# Each config class once: a preset (layer_mix, scaled_dwatt) is a config of its method's class.
ENCODER_CONFIGS = list(dict.fromkeys(method.config_cls for method in ENCODER_METHODS))
TOKEN_WISE_CONFIGS = list(dict.fromkeys(method.config_cls for method in ENCODER_METHODS if method.token_wise))

# The tiny models' sizes under BERT's names (other families' configs take them as they are, through
# their ``attribute_map``, or renamed: :func:`seq2seq_sizes`); a test module overrides what it needs.
TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=64,
)
torch.set_num_threads(1)  # tiny models: one thread is fastest and leaves the other core free

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(autouse=True)
def environment_as_it_was() -> Iterator[None]:
    """Each test ends with ``os.environ`` as it began.

    transformers 4.x's ``TrainingArguments(bf16=True)`` (TRL's default) writes
    ``ACCELERATE_MIXED_PRECISION=bf16`` into the process environment and never takes it back: every
    later ``Trainer`` of the process, and every ``accelerate`` run, then trains under bf16 autocast.
    """
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def seq2seq_sizes(sizes: dict) -> dict:
    """``sizes`` (BERT's names, as :data:`TINY`) under the names of BART-like encoder-decoders (BART,
    mBART, Whisper), the decoder as large as the encoder."""
    per_side = {
        "layers": sizes["num_hidden_layers"],
        "attention_heads": sizes["num_attention_heads"],
        "ffn_dim": sizes["intermediate_size"],
    }
    sides = {f"{side}_{name}": value for side in ("encoder", "decoder") for name, value in per_side.items()}
    common = ("vocab_size", "max_position_embeddings")
    return {"d_model": sizes["hidden_size"], **{name: sizes[name] for name in common}, **sides}


def tiny_bert(num_labels: int = 5, seed: int = 0, **overrides) -> BertForTokenClassification:
    """A 3-block, width-32 BERT token classifier in eval mode."""
    torch.manual_seed(seed)
    return BertForTokenClassification(BertConfig(**{**TINY, **overrides}, num_labels=num_labels)).eval()


def attach(
    config: LayerFusionConfig, base: nn.Module | None = None, seed: int = 0
) -> tuple[PeftModel, nn.Module]:
    """``(peft_model, untouched copy of the base)``; the fusion is built with seed ``seed``."""
    base = tiny_bert() if base is None else base
    reference = copy.deepcopy(base)
    torch.manual_seed(seed)
    return get_peft_model(base, config), reference


def perturbed_bert(config: LayerFusionConfig) -> tuple[PeftModel, torch.Tensor]:
    """A 3-block BERT without dropout carrying ``config``'s adapter, its fusion perturbed, in eval mode,
    and input ids ``(2, 7)``."""
    model, _ = attach(config, tiny_bert(**NO_DROPOUT))
    perturb_(fusion_of(model))
    return model.eval(), torch.randint(1, 50, (2, 7), generator=torch.Generator().manual_seed(1))


def fusion_of(model: nn.Module, adapter: str = "default") -> FusionModule:
    """The fusion module of ``adapter`` inside a PeftModel (or a model holding one)."""
    return fusion_layer_of(model).fusion_modules[adapter]


def perturb_(module: nn.Module, scale: float = 0.3, seed: int = 123) -> None:
    """Add noise to every parameter so no test relies on a special init (ones, zeros). A bounded blend
    (LayerMix's ``β = clamp(ρ, 0, 1)``) lands inside ``(0, 1)``: below 0 it reads as its start, ``e_b``."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            param.add_(scale * noise.to(param.dtype))
        for inner in module.modules():
            if getattr(inner, "bounded_blend", False) and "blend" in inner._parameters:
                inner.blend.abs_().clamp_(max=1.0)


class ToyBlock(nn.Module):
    """A block that returns a tuple ``(hidden, extra)``, as T5 and older BERTs do."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d, d)

    def forward(self, hidden: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        out = hidden + torch.tanh(self.linear(hidden)) * scale
        return out, out.mean()


class ToyEncoder(nn.Module):
    """``embed -> stack.blocks -> head``: a model no discovery rule knows (needs ``blocks_path``)."""

    def __init__(
        self, vocab: int = 20, d: int = 16, num_blocks: int = 3, num_labels: int = 4, by_keyword: bool = False
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.stack = ToyStack(d, num_blocks, by_keyword)
        self.head = nn.Linear(d, num_labels)

    def forward(self, input_ids: torch.Tensor, output_hidden_states: bool = False):
        hidden, states = self.stack(self.embed(input_ids))
        logits = self.head(hidden)
        return (logits, states) if output_hidden_states else logits


class ToyStack(nn.Module):
    def __init__(self, d: int, num_blocks: int, by_keyword: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ToyBlock(d) for _ in range(num_blocks))
        self.by_keyword = by_keyword  # call blocks as block(hidden=..., scale=...)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        states = [hidden]
        for block in self.blocks:
            hidden = block(hidden=hidden, scale=0.5)[0] if self.by_keyword else block(hidden, scale=0.5)[0]
            states.append(hidden)
        return hidden, states


def check_lifecycle(
    model: PeftModel, fresh_base: nn.Module, inputs: dict, tmp_path, plain: torch.Tensor, hooks_before: int
) -> None:
    """The PEFT lifecycle of an adapted model, on its logits.

    The adapter changes the logits; ``disable_adapter()`` gives exactly ``plain`` (the
    base logits); a save/load round trip onto ``fresh_base`` restores every tensor and the
    logits bitwise; ``merge_and_unload`` raises (one line); ``unload()`` leaves ``hooks_before`` hooks
    and the base logits.
    """
    with torch.no_grad():
        fused = model(**inputs).logits
        assert not torch.allclose(fused, plain), "the adapter must change the output"
        with model.disable_adapter():
            assert torch.equal(model(**inputs).logits, plain)
    model.save_pretrained(tmp_path)
    loaded = PeftModel.from_pretrained(fresh_base, tmp_path).eval()
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, fused)
    with pytest.raises(NotImplementedError, match="cannot fold a layer-fusion module"):
        loaded.merge_and_unload()
    unloaded = loaded.unload()
    assert count_hooks(unloaded) == hooks_before
    with torch.no_grad():
        assert torch.equal(unloaded(**inputs).logits, plain)


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


def write_tiny_model(
    directory: str | os.PathLike, seed: int = 0, layers: int = 3, width: int = 32, segments: bool = False
) -> str:
    """Save a tiny random BERT (``layers`` blocks, width ``width``) and its tokenizer (with ``segments``,
    token type ids 1 for the second text of a pair, as BERT's tokenizers); return the path.

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
    wordpiece_tokenizer(vocab, segments).save_pretrained(directory)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(dict.fromkeys(vocab)),
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=2 * width,
        max_position_embeddings=128,  # the recipes' default --max-length fits
    )
    BertModel(config).save_pretrained(directory)
    return str(directory)


def wordpiece_tokenizer(vocab: list[str], segments: bool = False):
    """A lower-casing BERT-style WordPiece fast tokenizer over ``vocab``, built with ``tokenizers``
    (with ``segments``: ``token_type_ids``, 1 for the second text of a pair).

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
        pair="[CLS] $A [SEP] $B:1 [SEP]:1" if segments else "[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    types = {"model_input_names": ["input_ids", "token_type_ids", "attention_mask"]} if segments else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        **types,
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


# A small NER sweep as its records say it (FE, N = 8, 25 epochs, 3 trials, LRs 0.01 and 0.1): per method
# the LR that wins on dev and its dev F1 on trial 0 (+0.04 a trial; 0.1 lower at the other LR; test = dev
# - 0.03). DWAtt records its depth attention, ScalarMix its mix weights, over blocks 1-3.
SWEEP_SETUP = "3f2a9c0d1e4b"
SWEEP_METHODS = {
    "none": (0.01, 0.40),
    "dwatt": (0.1, 0.55),
    "scalar_mix": (0.1, 0.50),
    "layer_mix": (0.1, 0.61),
}


def sweep_records(setup: str = SWEEP_SETUP) -> list[dict]:
    """The run records of the small sweep above (:data:`SWEEP_METHODS`), as a sweep writes them."""
    records = []
    for method, (best, first) in SWEEP_METHODS.items():
        for lr in (0.01, 0.1):
            for trial in range(3):
                dev = first + 0.04 * trial - (0.0 if lr == best else 0.1)
                record = {
                    "key": f"{method}|fe|8|25|{trial}|lr={lr!r}|{setup}",
                    **{"task": "ner", "setup": setup, "method": method, "regime": "fe", "shots": 8},
                    **{"epochs": 25, "trial": trial, "lr": lr, "dev_f1": dev, "test_f1": dev - 0.03},
                    "best_epoch": 25,
                    "curve": [{"epoch": e, "step": 2 * e, "dev_f1": dev * e / 25} for e in (5, 25)],
                    "dev_entities": 500,
                    "settings": {"model": "tiny-bert", "data": "toy-ner", "seed": 0},
                }
                if method == "dwatt":
                    record |= {"depth_attention": [0.2, 0.5, 0.3], "fused_layers": [1, 2, 3]}
                if method == "scalar_mix":
                    record |= {"mix_weights": [0.1, 0.6, 0.3]}
                records.append(record)
    return records


def probe_records(setup: str = SWEEP_SETUP) -> list[dict]:
    """The layer probes of :func:`sweep_records`' trials: blocks 1-3 read as they are and at unit RMS,
    block 2 the best on dev (0.60 on trial 0, +0.04 a trial, as it is), test = dev - 0.05."""
    records = []
    for trial in range(3):
        for features in ("none", "rms"):
            shift = 0.04 * trial - (0.0 if features == "none" else 0.05)
            layers = [
                {"layer": n, "penalty": 0.1, "penalty_on_edge": False, "dev_f1": dev + shift,
                 "test_f1": dev + shift - 0.05}
                for n, dev in ((1, 0.45), (2, 0.60), (3, 0.55))
            ]  # fmt: skip
            records.append(
                {
                    "key": f"probe|fe|8|25|{trial}|{setup}|features={features}",
                    **{"task": "ner", "setup": setup, "method": "probe", "regime": "fe", "shots": 8},
                    **{"epochs": 25, "trial": trial, "features": features, "metric": "f1", "layers": layers},
                }
            )
    return records


def write_sweep(directory: str | os.PathLike) -> str:
    """:func:`sweep_records` and :func:`probe_records` as a sweep leaves them in ``directory``
    (``results.jsonl``, ``results.probes.jsonl``); returns the results file's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, records in (("results.jsonl", sweep_records()), ("results.probes.jsonl", probe_records())):
        (directory / name).write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(directory / "results.jsonl")


def write_tiny_decoder(
    directory: str | os.PathLike, seed: int = 0, layers: int = 2, width: int = 32, family: str = "llama"
) -> str:
    """Save a tiny random decoder (``layers`` blocks, width ``width``; ``family`` ``llama``, or
    ``gemma3_text`` and ``opt``, which have no token-classification class in transformers; ``gpt2``,
    ``gpt_neox`` and ``t5`` (its encoder-decoder), whose block containers hold a parameter-less
    embedding dropout, at 0.1) and a tokenizer that starts every text with ``<s>`` and pads with
    ``<pad>`` (id 0); return the path.

    Example:
        >>> path = write_tiny_decoder(tmp_path / "llama")
        >>> AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import (
        AutoModelForCausalLM,
        Gemma3TextConfig,
        GPT2Config,
        GPTNeoXConfig,
        LlamaConfig,
        OPTConfig,
        PreTrainedTokenizerFast,
        T5Config,
        T5ForConditionalGeneration,
    )

    directory = Path(directory)
    vocab = ["<pad>", "<unk>", "<s>", "</s>", *WORDS, *"abcdefghijklmnopqrstuvwxyz"]
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    ids = {token: i for i, token in enumerate(dict.fromkeys(vocab))}
    backend = Tokenizer(models.WordPiece(ids, unk_token="<unk>"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", ids["<s>"])]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(directory)
    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(ids),
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=128,  # the default --max-length 128 fits
        pad_token_id=0,
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
    )
    rotary = dict(intermediate_size=2 * width, num_key_value_heads=2)
    config = {
        "llama": lambda: LlamaConfig(**common, **rotary),
        "gemma3_text": lambda: Gemma3TextConfig(
            **common,
            **rotary,
            head_dim=8,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "opt": lambda: OPTConfig(**common, ffn_dim=2 * width, word_embed_proj_dim=width),
        "gpt2": lambda: GPT2Config(**common, n_inner=2 * width),  # embd_pdrop 0.1: `transformer.drop`
        # hidden_dropout 0.1: `emb_dropout`
        "gpt_neox": lambda: GPTNeoXConfig(**common, intermediate_size=2 * width, hidden_dropout=0.1),
        # dropout_rate 0.1: `encoder.dropout`
        "t5": lambda: T5Config(
            vocab_size=len(ids),
            d_model=width,
            d_kv=8,
            d_ff=2 * width,
            num_layers=layers,
            num_heads=4,
            pad_token_id=0,
            eos_token_id=ids["</s>"],
            decoder_start_token_id=0,
        ),
    }[family]()
    if family == "t5":
        T5ForConditionalGeneration(config).save_pretrained(directory)
    else:
        AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return str(directory)


def write_text_data(directory: str | os.PathLike, sizes=(("train", 24), ("dev", 10), ("test", 10)),
                    pairs: bool = False, seed: int = 0) -> str:  # fmt: skip
    """Write CSV splits ``train.csv``/``dev.csv``/``test.csv`` of a 3-class toy task over :data:`WORDS`
    (a place name decides the class), header ``text,label`` (``premise,hypothesis,label`` with
    ``pairs``), label names; return the folder.

    Example:
        >>> load_texts(write_text_data(tmp_path / "data")).labels
        ['loc', 'org', 'per']
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    plain = [w for w in WORDS if not w.startswith("##") and w not in ENTITIES]
    for split, size in sizes:
        lines = ["premise,hypothesis,label" if pairs else "text,label"]
        for index in range(size):
            entity = list(ENTITIES)[index % len(ENTITIES)]
            words = [rng.choice(plain) for _ in range(rng.randint(2, 6))]
            words.insert(rng.randint(0, len(words)), entity)
            text = " ".join(words)
            second = f",{' '.join(rng.choice(plain) for _ in range(3))}" if pairs else ""
            lines.append(f"{text}{second},{ENTITIES[entity].lower()}")
        (directory / f"{split}.csv").write_text("\n".join(lines) + "\n")
    return str(directory)


def write_folders(tmp_path_factory, **writers: Callable[[Path], str]) -> dict[str, str]:
    """Write each ``name=writer`` into its own folder ``name`` of a fresh temporary folder (a test
    module's models and data, written once); return ``{name: path}``.

    Example:
        >>> write_folders(tmp_path_factory, model=write_tiny_model, data=write_text_data)["model"]
    """
    root = tmp_path_factory.mktemp("folders")
    return {name: write(root / name) for name, write in writers.items()}


@pytest.fixture
def script(monkeypatch) -> Callable[[str], ModuleType]:
    """``script("name")``: the module of ``benchmarks/name.py``, imported as running it imports it (the
    benchmarks are scripts run from their folder: ``benchmarks/`` first on the path)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))
    return importlib.import_module


@pytest.fixture
def bert() -> BertForTokenClassification:
    return tiny_bert()


@pytest.fixture
def input_ids() -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(1, TINY["vocab_size"], (2, 7), generator=generator)


@pytest.fixture
def attention_mask() -> torch.Tensor:
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0  # the second sequence is padded
    return mask


@contextmanager
def collector_off() -> Iterator[None]:
    """Python's cyclic collector off inside (as between its rare full passes in a long sweep); its
    state before is restored after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def survivors(build: Callable[[], nn.Module], use: Callable[[nn.Module], object]) -> list[str]:
    """The modules of the model ``build()`` returns that outlive its last reference, once ``use(model)``
    ran, with Python's cyclic collector off: ``[]`` when the model is freed at once, as a plain
    transformers model is (no part of an adapter holds it in a reference cycle)."""
    gc.collect()
    with collector_off():
        model = build()
        use(model)
        modules = [(name, weakref.ref(module)) for name, module in model.named_modules()]
        del model
        return [name or "(the model)" for name, module in modules if module() is not None]


TINY_TOKENS = ["<unk>", "<s>", "</s>", "\u2581"] + list("abcdefghij") + [f"\u2581{c}" for c in "abcdefghij"]


def write_tiny_llama_gguf(path: Path, d: int = 16, blocks: int = 2, heads: int = 2, ff: int = 32) -> Path:
    """A 2-block, width-16 Llama with a 24-token sentencepiece vocabulary, float32 tensors."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(64)
    writer.add_embedding_length(d)
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(d // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(len(TINY_TOKENS))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TINY_TOKENS)
    writer.add_token_scores([0.0] * 3 + [-float(i) for i in range(len(TINY_TOKENS) - 3)])
    writer.add_token_types([2, 3, 3] + [1] * (len(TINY_TOKENS) - 3))  # unknown, control x2, normal
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    generator = np.random.default_rng(0)

    def add(name: str, *shape: int) -> None:
        writer.add_tensor(name, (0.2 * generator.standard_normal(shape)).astype(np.float32))

    add("token_embd.weight", len(TINY_TOKENS), d)
    for block in range(blocks):
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{block}.{norm}.weight", np.ones(d, np.float32))
        for projection in ("attn_q", "attn_k", "attn_v", "attn_output"):
            add(f"blk.{block}.{projection}.weight", d, d)
        add(f"blk.{block}.ffn_gate.weight", ff, d)
        add(f"blk.{block}.ffn_up.weight", ff, d)
        add(f"blk.{block}.ffn_down.weight", d, ff)
    writer.add_tensor("output_norm.weight", np.ones(d, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
