"""No silent wrong results in the model (issue 12, points 2 and 4-9; issue 15's two warnings).

Copies carry a working fusion; a failed set-up leaves the base exactly as it was; bad config
values, block lists the forward does not run, weighted fusion adapters
and missing checkpoints all fail loudly, naming the cause.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import transformers as tf
from conftest import TINY, perturb_, tiny_bert
from peft import PeftModel, get_peft_model
from torch import nn

import peft_layerfusion.methods.dwatt as dwatt
from peft_layerfusion import (
    ConcatConfig,
    DWAttConfig,
    ExtraLayersConfig,
    SurfaceFusionConfig,
    count_hooks,
)
from peft_layerfusion.comparison.checkpoints import load_trained, save_trained
from peft_layerfusion.layer import fusion_layer_of


def fused(config, base: nn.Module | None = None) -> PeftModel:
    """``config`` on a tiny BERT, its fusion perturbed away from any special init."""
    model = get_peft_model(tiny_bert() if base is None else base, config).eval()
    perturb_(fusion_layer_of(model))
    return model


def logits(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits


def plain_logits(model: PeftModel, input_ids: torch.Tensor) -> torch.Tensor:
    with model.disable_adapter():
        return logits(model, input_ids)


# ----------------------------------------------------------------------------- 2. copies
@pytest.mark.parametrize("make_copy", ["deepcopy", "averaged_model"])
def test_copies_carry_a_working_fusion_of_their_own(make_copy, input_ids):
    model = fused(DWAttConfig(modules_to_save=["classifier"]))
    original = logits(model, input_ids)
    unfused = plain_logits(model, input_ids)
    if make_copy == "deepcopy":
        copied = copy.deepcopy(model)
    else:
        copied = torch.optim.swa_utils.AveragedModel(model)
    assert torch.equal(logits(copied, input_ids), original)
    assert (logits(copied, input_ids) - unfused).abs().max() > 0.05
    with torch.no_grad():  # the copy's fusion is its own: changing it leaves the original alone
        fusion_layer_of(copied).fusion_modules["default"].value_norm_bias.add_(1.0)
    assert not torch.allclose(logits(copied, input_ids), original)
    assert torch.equal(logits(model, input_ids), original)


def test_deepcopy_of_a_seq2seq_fusion_uses_the_copy():
    torch.manual_seed(0)
    config = tf.BartConfig(
        vocab_size=40, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
        init_std=0.3,
    )  # fmt: skip
    model = get_peft_model(tf.BartForConditionalGeneration(config).eval(), SurfaceFusionConfig()).eval()
    module = fusion_layer_of(model).fusion_modules["default"]
    with torch.no_grad():
        module.ffn_down.weight.normal_(0, 0.3)
    ids = torch.randint(3, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "decoder_input_ids": ids[:, :4]}
    with torch.no_grad():
        original = model(**inputs).logits
        copied = copy.deepcopy(model)
        assert torch.equal(copied(**inputs).logits, original)
        fusion_layer_of(copied).fusion_modules["default"].ffn_down.bias.add_(1.0)
        assert not torch.allclose(copied(**inputs).logits, original)
        assert torch.equal(model(**inputs).logits, original)
    assert copied.base_model.model.generate.model() is copied.base_model.model  # generate wraps the copy


# ----------------------------------------------------------------------------- 4. failed set-up
def base_state(model: nn.Module) -> dict:
    return {
        "hooks": count_hooks(model, package=None),
        "keys": sorted(model.state_dict()),
        "frozen": sorted(n for n, p in model.named_parameters() if not p.requires_grad),
        "modules": sorted(n for n, _ in model.named_modules()),
    }


def test_failure_inside_injection_rolls_everything_back(monkeypatch, input_ids):
    base = tiny_bert()
    before, outputs_before = base_state(base), logits(base, input_ids)

    def broken(self, config, context):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(dwatt.DWAtt, "__init__", broken)
    config = DWAttConfig(target_modules=["query", "value"], bias="all", modules_to_save=["classifier"])
    with pytest.raises(RuntimeError, match="simulated"):
        get_peft_model(base, config)
    monkeypatch.undo()
    assert base_state(base) == before  # no hook, no LoRA layer, no wrapper, nothing frozen
    assert torch.equal(logits(base, input_ids), outputs_before)
    # the base can now take another method, and what trains is saved under that method's key
    model = fused(ConcatConfig(modules_to_save=["classifier"]), base)
    assert all(k.startswith("base_model.model.bert.encoder.layer_fusion.concat_fusion") or "classifier" in k
               for k in [n for n, p in model.named_parameters() if p.requires_grad])  # fmt: skip


def test_refused_method_leaves_the_base_untouched(input_ids):
    base = tiny_bert()
    before = base_state(base)
    with pytest.raises(ValueError, match="not an encoder-decoder"):
        get_peft_model(base, SurfaceFusionConfig(modules_to_save=["classifier"]))
    assert base_state(base) == before


def test_failed_add_adapter_keeps_the_first_adapter(monkeypatch, input_ids):
    model = fused(DWAttConfig(modules_to_save=["classifier"]))
    outputs = logits(model, input_ids)
    hooks = count_hooks(model)

    def broken(self, config, context):
        raise RuntimeError("simulated")

    monkeypatch.setattr(dwatt.DWAtt, "__init__", broken)
    with pytest.raises(RuntimeError):
        model.add_adapter("second", DWAttConfig())
    monkeypatch.undo()
    assert list(fusion_layer_of(model).fusion_modules) == ["default"]
    assert count_hooks(model) == hooks
    assert torch.equal(logits(model, input_ids), outputs)
    model.add_adapter("second", DWAttConfig())  # adding to the same PeftModel still works
    model.set_adapter("second")
    assert not torch.equal(logits(model, input_ids), outputs)


def test_a_base_already_carrying_a_fusion_is_refused():
    base = tiny_bert()
    get_peft_model(base, DWAttConfig())
    hooks = count_hooks(base)
    with pytest.raises(ValueError, match="already carries a layer-fusion adapter"):
        get_peft_model(base, ConcatConfig())
    assert count_hooks(base) == hooks


# ----------------------------------------------------------------------------- 5. config values
@pytest.mark.parametrize(
    ("config_cls", "field", "value"),
    [
        (DWAttConfig, "query_bottleneck_width", math.inf),
        (DWAttConfig, "value_bottleneck_width", "8"),
        (DWAttConfig, "d_pos", 2.0),
        (SurfaceFusionConfig, "fusion_lambda", "0.5"),
        (SurfaceFusionConfig, "temperature", math.inf),
        (SurfaceFusionConfig, "temperature", math.nan),
        (SurfaceFusionConfig, "source_scale", math.inf),
        (SurfaceFusionConfig, "attention_dropout", True),
        (ExtraLayersConfig, "num_extra_layers", "2"),
        (ExtraLayersConfig, "num_extra_layers", 0),
    ],
)
def test_bad_config_values_name_field_value_and_allowed(config_cls, field, value):
    with pytest.raises(ValueError, match=rf"`{field}`={value!r}.*expected"):
        config_cls(**{field: value})


def test_too_many_extra_layers_are_refused_before_the_model_is_touched():
    base = tiny_bert()
    before = base_state(base)
    with pytest.raises(ValueError, match=r"`num_extra_layers`=10000 .*\[1, 3\]"):
        get_peft_model(base, ExtraLayersConfig(num_extra_layers=10000))
    assert base_state(base) == before


@pytest.mark.parametrize("rank", [32, 100])
def test_a_concat_map_rank_at_or_above_the_width_is_refused_before_the_model_is_touched(rank):
    """Issue 37: at ``map_rank >= d`` the "low-rank" maps (2 K d r + d) outgrow the full ones (K d^2 + d)."""
    base = tiny_bert()  # d = 32
    before = base_state(base)
    one_line = rf"^`map_rank`={rank} is not allowed: expected None \(full maps\) or an int in \[1, 31\]"
    with pytest.raises(ValueError, match=one_line):
        get_peft_model(base, ConcatConfig(map_rank=rank))
    assert base_state(base) == before and count_hooks(base) == 0
    assert get_peft_model(base, ConcatConfig(map_rank=31)) is not None  # just below d: built


# ----------------------------------------------------------------------------- 7. discovery
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(hidden))


class BlocksAtRoot(nn.Module):
    """Blocks listed at the model root, whose output is the head's (a dict)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids: torch.Tensor) -> dict:
        hidden = self.embed(input_ids)
        for block in self.blocks:
            hidden = block(hidden)
        return {"logits": self.head(hidden)}


class LayersInHead(nn.Module):
    """The only ``layers`` list sits in the head; an unused ``aux.layers`` list of blocks too."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.body = nn.Sequential(Block(), Block())
        self.head = nn.Module()
        self.head.layers = nn.ModuleList([nn.Linear(8, 4), nn.Linear(4, 2)])
        self.aux = nn.Module()
        self.aux.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.body(self.embed(input_ids))
        for layer in self.head.layers:
            hidden = layer(hidden)
        return hidden


def test_blocks_at_the_root_raise_naming_blocks_path():
    model = get_peft_model(BlocksAtRoot(), ConcatConfig(blocks_path="blocks"))
    with pytest.raises(RuntimeError, match=r"blocks_path='blocks'.*not the encoder's hidden state"):
        model(input_ids=torch.tensor([[1, 2, 3]]))


def test_a_head_layers_list_is_not_taken_for_the_encoder():
    with pytest.raises(ValueError, match="Could not find the encoder blocks"):
        get_peft_model(LayersInHead(), DWAttConfig())


def test_a_fusion_whose_hooks_never_fire_raises_naming_blocks_path():
    model = get_peft_model(LayersInHead(), DWAttConfig(blocks_path="aux.blocks"))
    with pytest.raises(RuntimeError, match=r"did not run .*blocks_path='aux.blocks'"):
        model(input_ids=torch.tensor([[1, 2, 3]]))
    with model.disable_adapter():  # without the fusion nothing is expected to run
        model(input_ids=torch.tensor([[1, 2, 3]]))


def test_a_fusion_whose_hooks_never_fire_raises_under_torch_compile_too():
    """Issue 37 item 1: the check reads per-thread counts that dynamo used to drop; compiled, with a
    graph break after the blocks, it still fires when the hooks really never ran."""
    dynamo = pytest.importorskip("torch._dynamo", reason="torch without torch.compile")
    if not dynamo.is_dynamo_supported():
        pytest.skip("torch.compile is not supported on this Python")
    model = get_peft_model(LayersInHead(), DWAttConfig(blocks_path="aux.blocks"))
    model.base_model.model.head.layers[1].register_forward_pre_hook(lambda module, args: dynamo.graph_break())
    dynamo.reset()
    try:
        compiled = torch.compile(model, backend="eager")
        for _ in range(2):
            with pytest.raises(RuntimeError, match=r"did not run .*blocks_path='aux.blocks'"):
                compiled(input_ids=torch.tensor([[1, 2, 3]]))
    finally:
        dynamo.reset()


class SkippingStack(nn.Module):
    """Runs its blocks but skips those in ``skip`` (as layer drop does in training)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.skip: set[int] = set()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for index, block in enumerate(self.blocks):
            if index not in self.skip:
                hidden = block(hidden)
        return hidden


class SkippingEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.stack = SkippingStack()
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.stack(self.embed(input_ids)))


def test_blocks_skipped_in_a_forward_raise():
    config = DWAttConfig(blocks_path="stack.blocks", modules_to_save=["head"])
    model = get_peft_model(SkippingEncoder(), config)
    ids = torch.tensor([[1, 2, 3]])
    assert model(input_ids=ids).shape == (1, 3, 2)
    model.base_model.model.stack.skip = {1}
    model.eval()  # in training a skipped block is layer drop, fused exactly (tests/test_edges2.py)
    with pytest.raises(RuntimeError, match=r"blocks \[1\] of blocks_path='stack.blocks'.*did not run"):
        model(input_ids=ids)


# ----------------------------------------------------------------------------- 8, 9
def test_add_weighted_adapter_is_refused():
    model = get_peft_model(tiny_bert(), DWAttConfig())
    model.add_adapter("other", DWAttConfig())
    with pytest.raises(NotImplementedError, match="add_weighted_adapter cannot combine layer-fusion"):
        model.add_weighted_adapter(["default", "other"], [0.5, 0.5], "combined")
    assert list(model.peft_config) == ["default", "other"]


def test_load_trained_refuses_missing_and_foreign_directories(tmp_path, input_ids):
    with pytest.raises(FileNotFoundError, match="no directory"):
        load_trained(tiny_bert(), tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileNotFoundError, match=r"holds none of .*adapter_config.json.*notes.txt"):
        load_trained(tiny_bert(), tmp_path)
    model = fused(DWAttConfig(modules_to_save=["classifier"]))  # a real one still loads
    save_trained(model, tmp_path / "saved")
    loaded = load_trained(tiny_bert(), tmp_path / "saved")
    assert torch.equal(logits(loaded, input_ids), logits(model, input_ids))


# ----------------------------------------------------------------------------- issue 15
def head_warnings(config) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        get_peft_model(tiny_bert(), config)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    return [message for message in messages if "task head" in message]


def test_a_frozen_task_head_warns_with_the_fix():
    messages = head_warnings(DWAttConfig())
    assert len(messages) == 1
    assert "['classifier']" in messages[0] and 'task_type="TOKEN_CLS"' in messages[0]
    assert "modules_to_save" in messages[0]
    assert head_warnings(DWAttConfig(modules_to_save=["classifier"])) == []
    assert head_warnings(DWAttConfig(task_type="TOKEN_CLS")) == []
    assert head_warnings(DWAttConfig(inference_mode=True)) == []


def tiny_albert() -> nn.Module:
    torch.manual_seed(0)
    config = tf.AlbertConfig(
        vocab_size=TINY["vocab_size"], embedding_size=16, hidden_size=32, num_hidden_layers=3,
        num_attention_heads=4, intermediate_size=48,
    )  # fmt: skip
    return tf.AlbertForTokenClassification(config).eval()


@pytest.mark.parametrize("blocks_path", ["albert_layers", "albert_layer_groups"])
def test_shared_albert_blocks_warn(blocks_path, input_ids):
    config = DWAttConfig(blocks_path=blocks_path, modules_to_save=["classifier"])
    model = get_peft_model(tiny_albert(), config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(input_ids=input_ids)
    shared = [str(w.message) for w in caught if "share weights" in str(w.message)]
    assert len(shared) == 1 and "runs per forward: [3]" in shared[0] and blocks_path in shared[0]


def test_the_same_block_listed_twice_warns_at_set_up():
    base = tiny_bert()
    layers = base.bert.encoder.layer
    base.bert.encoder.layer = nn.ModuleList([layers[0], layers[1], layers[0]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        get_peft_model(base, DWAttConfig(modules_to_save=["classifier"]))
    assert sum("share weights" in str(w.message) for w in caught) == 1
