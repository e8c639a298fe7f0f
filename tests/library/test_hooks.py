"""BlockCapture: what it captures, tuple vs tensor blocks, and that nothing outlives a forward."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
from conftest import NO_DROPOUT, ToyEncoder, attach, fusion_of, perturb_, perturbed_bert, tiny_bert
from peft import get_peft_model
from tiny_decoders import NAMES, adapted, token_ids, with_blocks
from transformers import T5Config, T5EncoderModel

from peft_layerfusion import DWAttConfig, ExtraLayersConfig, ScalarMixConfig, count_hooks, find_encoder_blocks
from peft_layerfusion.hooks import BlockCapture, first_tensor
from peft_layerfusion.layer import fusion_layer_of


def test_capture_sees_every_hidden_state_and_replaces_the_output(bert, input_ids):
    seen = []

    def fuse(capture):
        seen.append([s.clone() for s in capture.states])
        return capture.states[-1] * 2.0

    with torch.no_grad():
        expected = bert(input_ids=input_ids, output_hidden_states=True)
        capture = BlockCapture(find_encoder_blocks(bert), fuse)
        assert capture.num_hooks == 2 + 2 * 3  # container pre/post + pre/post per block
        assert count_hooks(bert) == 8 + 2  # and the container's forward guard (HookedForward)
        got = bert.bert(input_ids=input_ids).last_hidden_state
    assert len(seen) == 1 and len(seen[0]) == 4
    for mine, theirs in zip(seen[0], expected.hidden_states, strict=True):
        assert torch.equal(mine, theirs)
    assert torch.equal(got, expected.hidden_states[-1] * 2.0)
    capture.remove()
    assert count_hooks(bert) == 0 and capture.num_hooks == 0
    with torch.no_grad():
        assert torch.equal(bert.bert(input_ids=input_ids).last_hidden_state, expected.hidden_states[-1])


def test_fuse_returning_none_leaves_output_untouched(bert, input_ids):
    capture = BlockCapture(find_encoder_blocks(bert), lambda c: None)
    with torch.no_grad():
        out = bert(input_ids=input_ids).logits
    capture.remove()
    with torch.no_grad():
        assert torch.equal(out, bert(input_ids=input_ids).logits)


def test_first_tensor_handles_tensor_tuple_and_model_output():
    from transformers.modeling_outputs import BaseModelOutput

    x = torch.randn(2, 3)
    assert first_tensor(x) is x
    assert first_tensor((x, None)) is x
    assert first_tensor(BaseModelOutput(last_hidden_state=x)) is x


# ----------------------------------------------------------------------------- tuple-returning blocks
def test_custom_encoder_with_tuple_blocks(input_ids):
    torch.manual_seed(0)
    model = ToyEncoder()
    ids = input_ids % 20
    with torch.no_grad():
        base_logits, states = model(ids, output_hidden_states=True)
        model = get_peft_model(model, ScalarMixConfig(blocks_path="stack.blocks", modules_to_save=["head"]))
        module = fusion_of(model)
        perturb_(module)
        got = model(ids)
        weights = torch.softmax(module.layer_logits, 0)
        mixed = sum(w * s for w, s in zip(weights, states[1:], strict=True))
        expected = model.base_model.model.head(module.gamma * mixed)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert (got - base_logits).abs().max() > 1e-3
    with model.disable_adapter(), torch.no_grad():
        assert torch.equal(model(ids), base_logits)


@pytest.mark.parametrize("by_keyword", [False, True], ids=["positional", "keyword"])
def test_extra_layers_reuse_the_last_block_call(by_keyword, input_ids):
    torch.manual_seed(0)
    ids = input_ids % 20
    model = ToyEncoder(by_keyword=by_keyword)
    model = get_peft_model(model, ExtraLayersConfig(num_extra_layers=2, blocks_path="blocks"))
    extra = fusion_of(model).blocks
    with torch.no_grad():
        got = model(ids)
        with model.disable_adapter():
            _, states = model(ids, output_hidden_states=True)
        hidden = states[-1]
        for block in extra:
            hidden = block(hidden, scale=0.5)[0]  # the same `scale` the model's blocks received
        expected = model.base_model.model.head(hidden)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert not torch.equal(extra[0].linear.weight, model.base_model.model.stack.blocks[-1].linear.weight)


def test_t5_encoder_blocks_return_tuples(input_ids):
    torch.manual_seed(0)
    config = T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4)
    base = T5EncoderModel(config).eval()
    outputs = []
    handle = base.encoder.block[0].register_forward_hook(lambda module, args, out: outputs.append(out))
    with torch.no_grad():
        base(input_ids=input_ids)
    handle.remove()
    assert isinstance(outputs[0], tuple)  # the case this test is about
    model, reference = attach(DWAttConfig(), base=base)
    perturb_(fusion_of(model))
    norm = reference.encoder.final_layer_norm  # T5 is pre-norm: the rule of fusion.py
    seen = []
    norm.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        fused = model(input_ids=input_ids).last_hidden_state
        z = reference(input_ids=input_ids, output_hidden_states=True).hidden_states
        z = (*z[:-1], seen[-1])  # z_L: the final norm's input
        module = fusion_of(model)
        # DWAtt recomputed from the module's own pieces on the reference states, then the final norm
        last = z[-1].reshape(-1, 32)
        weights = module.depth_attention(last)
        expected = norm(last + sum(
            weights[:, n : n + 1] * module.value(n, z[n + 1].reshape(-1, 32)) for n in range(2)
        ))  # fmt: skip
    torch.testing.assert_close(fused, expected.view_as(fused), atol=1e-5, rtol=0)
    assert (fused - norm(z[-1])).abs().max() > 1e-3


def t5_grads(use_reentrant, input_ids) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    config = T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, dropout_rate=0.0)
    model, _ = attach(DWAttConfig(), base=T5EncoderModel(config), seed=1)
    for name, param in model.named_parameters():
        if ".block.1." in name:
            param.requires_grad_(True)  # part of the encoder trains too
    if use_reentrant is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
        assert model.base_model.model.encoder.block[0].gradient_checkpointing
        # transformers 5 does this inside gradient_checkpointing_enable, 4.57 leaves it to the caller: without
        # it re-entrant checkpointing gives block 1 (whose input needs no grad) no gradient, fusion or not
        model.enable_input_require_grads()
    model.train()
    target = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(0))
    (model(input_ids=input_ids).last_hidden_state * target).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_t5_gradient_checkpointing_with_tuple_blocks(use_reentrant, input_ids):
    plain, checkpointed = t5_grads(None, input_ids), t5_grads(use_reentrant, input_ids)
    assert plain.keys() == checkpointed.keys() and any(".block.1." in n for n in plain)
    for name, grad in plain.items():
        assert grad.abs().sum() > 0, name
        # recomputation rounds differently on some CPUs (seen: 4e-6 on gradients of size 12);
        # a lost or doubled gradient path is off by O(1)
        torch.testing.assert_close(checkpointed[name], grad, atol=2e-5, rtol=1e-5, msg=name)


# ----------------------------------------------------------------------------- nothing kept alive
def test_no_growth_over_many_forwards(input_ids):
    model, _ = attach(DWAttConfig())
    capture = fusion_layer_of(model).capture
    with torch.no_grad():
        for _ in range(20):  # warm-up: caches, lazy imports
            model(input_ids=input_ids)
        gc.collect()
        objects_before = len(gc.get_objects())
        for _ in range(1000):
            model(input_ids=input_ids)
            assert capture._open is None
            assert capture._last_call == ((), {})
        gc.collect()
        objects_after = len(gc.get_objects())
    assert objects_after - objects_before < 50, (objects_before, objects_after)


def test_captured_tensors_die_after_forward(input_ids):
    model, _ = attach(DWAttConfig())
    capture = fusion_layer_of(model).capture
    captured = []
    original_fuse = capture.fuse

    def fuse(c):
        captured.extend(weakref.ref(s) for s in c.states if s is not None)
        return original_fuse(c)

    capture.fuse = fuse
    with torch.no_grad():
        for _ in range(5):
            model(input_ids=input_ids)
    out = model(input_ids=input_ids).logits  # with autograd: the graph holds them while `out` lives
    assert len(captured) == 6 * 3  # z_1 .. z_3: in eval mode block 0's input z_0, not fused, is not hooked
    del out
    gc.collect()
    assert all(ref() is None for ref in captured)


def test_capture_closed_after_an_exception_inside_fuse(input_ids):
    bert = tiny_bert()
    calls = []

    def fuse(capture):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return None

    capture = BlockCapture(find_encoder_blocks(bert), fuse)
    with pytest.raises(RuntimeError, match="boom"):
        bert(input_ids=input_ids)
    assert capture._open is None and capture._last_call == ((), {})
    with torch.no_grad():
        bert(input_ids=input_ids)
    assert len(calls) == 2
    capture.remove()


# ----------------------------------------------------------------------------- only the blocks read
def three_blocks(family: str, config):
    """A 3-block model of ``family`` (``bert``: a token classifier; else a causal LM) with ``config``'s
    adapter, perturbed, in eval mode, and its inputs."""
    if family == "bert":
        return perturbed_bert(config)
    return adapted(with_blocks(family, "causal", 3), config), token_ids()


def block_hooks(model) -> list[int]:
    """How many of this package's hooks each block of the fused stack carries."""
    return [count_hooks(block) for block in fusion_layer_of(model).located.blocks]


def logits_with_every_block_hooked(model, ids) -> torch.Tensor:
    """The logits of ``model`` with its capture hooking every block (as in training), then lean again."""
    layer = fusion_layer_of(model)
    layer.capture.hook_blocks(None, lean=False)
    try:
        with torch.no_grad():
            return model(input_ids=ids).logits
    finally:
        layer.hook_read_blocks()


READS = {  # config -> the blocks hooked in eval mode, of 3: the inputs z_i (i < 3) fused, and the last
    "dwatt": (lambda: DWAttConfig(), (1, 2)),  # z_1 .. z_3: z_0 (the embeddings) is not fused
    "dwatt z_0, z_3": (lambda: DWAttConfig(layers=[0, 3]), (0, 2)),
    "scalar_mix z_1": (lambda: ScalarMixConfig(layers=[1, 3]), (1, 2)),
    "extra_layers": (lambda: ExtraLayersConfig(num_extra_layers=1), (2,)),  # z_L and the last block's call
}


@pytest.mark.parametrize("family", ["bert", *NAMES])
@pytest.mark.parametrize("case", list(READS))
def test_eval_mode_hooks_only_the_blocks_read(case, family):
    # A hooked block leaves torch's fast call path: in eval mode only the blocks whose inputs are fused, and
    # the last, are hooked; the logits are those of the capture hooking every block, bitwise. Training
    # hooks every block again (layer drop needs their outputs).
    make_config, hooked = READS[case]
    model, ids = three_blocks(family, make_config())
    capture = fusion_layer_of(model).capture
    assert capture.hooked == hooked
    assert block_hooks(model) == [2 if index in hooked else 0 for index in range(3)]
    with torch.no_grad():
        lean = model(input_ids=ids).logits
    assert torch.equal(lean, logits_with_every_block_hooked(model, ids))
    model.train()
    assert capture.hooked == (0, 1, 2) and block_hooks(model) == [2, 2, 2]
    model.eval()
    assert capture.hooked == hooked


def test_a_training_forward_hooks_every_block_before_they_run(input_ids):
    # The fusion layer in eval mode, but its container set to training on its own (a block dropped by
    # layer drop would be read from the previous block's output): the forward hooks every block first.
    model, _ = attach(DWAttConfig(), tiny_bert(**NO_DROPOUT))
    model.eval()
    layer = fusion_layer_of(model)
    assert layer.capture.hooked == (1, 2)
    layer.located.container.train()
    seen = []
    layer.capture.fuse = lambda capture: seen.append(sum(state is not None for state in capture.states))
    model(input_ids=input_ids)
    assert layer.capture.hooked == (0, 1, 2) and seen == [4]


def test_the_blocks_hooked_are_those_every_adapter_reads(input_ids):
    model, _ = attach(DWAttConfig(layers=[2, 3]), tiny_bert(**NO_DROPOUT))
    model.eval()
    capture = fusion_layer_of(model).capture
    assert capture.hooked == (2,)
    model.add_adapter("wide", DWAttConfig(layers=[0, 3]))
    assert capture.hooked == (0, 2)  # whichever adapter is active: the union of what they read
    model.set_adapter("wide")
    with torch.no_grad():
        lean = model(input_ids=input_ids).logits
    assert torch.equal(lean, logits_with_every_block_hooked(model, input_ids))
    model.set_adapter("default")
    model.delete_adapter("wide")
    assert capture.hooked == (2,)


def test_a_deep_copy_rehooks_its_own_blocks(input_ids):
    model, _ = attach(DWAttConfig(layers=[2, 3]), tiny_bert(**NO_DROPOUT))
    model.eval()
    copied = copy.deepcopy(model)
    copied.train()
    assert block_hooks(copied) == [2, 2, 2] and block_hooks(model) == [0, 0, 2]
    copied.eval()
    with torch.no_grad():
        assert torch.equal(copied(input_ids=input_ids).logits, model(input_ids=input_ids).logits)
    assert block_hooks(copied) == [0, 0, 2]
