"""Layer fusion on decoder-only LLMs (issue 26, items 1 and 3): every head, every family, recomputed.

Families: Llama, Qwen2, Qwen3, Mistral, Gemma 3 (text), Phi-3, GPT-2, GPT-NeoX, Falcon, BLOOM,
GPT-J, OPT (tiny random configs, ``tiny_decoders.py``). Heads: ``*ForCausalLM``,
``*ForSequenceClassification`` (pooled at the last real token, right and left padding),
``*ForTokenClassification`` where transformers has one.

* token-wise methods (the registry's ``token_wise`` ones): the head's output equals the model's
  own final norm ``F`` and head applied to the method's formula (``test_methods.REFERENCES``) on the
  residual stream ``z_0 .. z_L``, recomputed from ``output_hidden_states`` of an untouched copy (the
  pre-norm placement rule of ``fusion.py``);
* R+n: the model with its extra blocks appended to the block list ("the model with n more
  blocks": causal mask, rotary positions and final norm its own).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers as tf
from conftest import fusion_of, survivors
from peft import get_peft_model
from test_decoder_generation import NEW_TOKENS, assert_scores_close, cached_generate, uncached_greedy
from test_methods import REFERENCES
from tiny_decoders import (
    COMMON,
    FAMILIES,
    NAMES,
    TASK_TYPES,
    adapted,
    head_output,
    last_real_index,
    padded,
    residual_stream,
    token_ids,
    with_blocks_appended,
    with_norm_gains,
)

from peft_layerfusion import DWAttConfig, ExtraLayersConfig, find_encoder_blocks, fused_positions
from peft_layerfusion.registration import ENCODER_METHODS, SEQ2SEQ_METHODS

TOKEN_WISE = [method for method in ENCODER_METHODS if method.token_wise]
# (family, head, padding side): the heads each family has; sequence classification on both sides
CASES = [
    (name, head, side)
    for name in NAMES
    for head in FAMILIES[name].heads
    for side in (("right", "left") if head == "seq" else ("right",))
]
CASE_IDS = [f"{name}-{head}-{side}" for name, head, side in CASES]
ATOL = 2e-5


def inputs_for(head: str, side: str) -> dict[str, torch.Tensor]:
    if head == "seq":
        return padded(side)
    ids = token_ids()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def output_of(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits


@pytest.mark.parametrize("method", TOKEN_WISE, ids=[m.name for m in TOKEN_WISE])
@pytest.mark.parametrize("name, head, side", CASES, ids=CASE_IDS)
def test_token_wise_fusion_equals_the_recomputation(name, head, side, method):
    family = FAMILIES[name]
    reference = family.build(head)
    model = adapted(family.build(head), method.make_config(task_type=TASK_TYPES[head]))
    inputs = inputs_for(head, side)
    states = residual_stream(family, reference, inputs)
    layers = list(range(1, len(states)))
    h = REFERENCES[method.config_cls](states, layers, fusion_of(model))
    expected = head_output(family, reference, head, h, inputs)
    got = output_of(model, inputs)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=1e-5)
    plain = output_of(reference, inputs)
    assert (got - plain).abs().max() > 1e-3  # the fusion changes what the head reads


def test_dwatt_on_unit_rms_states_moves_what_a_massive_stream_hides():
    """The case ``state_norm="rms"`` is for: a stream of RMS about 2000 (embeddings x 1e5) that the final
    norm brings back to unit scale. The paper's unit-scale values move the logits (up to 0.45) by about
    2e-4; counted in units of the stream, by about 0.3."""
    family = FAMILIES["llama"]
    base = family.build("causal")
    inputs = inputs_for("causal", "right")
    with torch.no_grad():
        embeddings = base.get_input_embeddings()
        embeddings.weight.mul_(1e5)  # a stream of RMS about 2000, as deep LLMs have
    plain = output_of(base, inputs)
    moved = {}
    for state_norm in ("none", "rms"):
        config = DWAttConfig(state_norm=state_norm, fusion_init="paper", task_type=TASK_TYPES["causal"])
        moved[state_norm] = (output_of(adapted(copy.deepcopy(base), config), inputs) - plain).abs().max()
    assert moved["none"] < 1e-3 and moved["rms"] > 0.1


@pytest.mark.parametrize("name, head, side", CASES, ids=CASE_IDS)
def test_extra_layers_equal_the_model_with_more_blocks(name, head, side):
    family = FAMILIES[name]
    base = family.build(head)
    model = adapted(copy.deepcopy(base), ExtraLayersConfig(num_extra_layers=1, task_type=TASK_TYPES[head]))
    deeper = with_blocks_appended(family, base, list(fusion_of(model).blocks))
    inputs = inputs_for(head, side)
    got = output_of(model, inputs)
    torch.testing.assert_close(got, output_of(deeper, inputs), atol=ATOL, rtol=1e-5)
    assert (got - output_of(base, inputs)).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["llama", "gemma3_text", "gpt2"])
def test_building_extra_layers_copies_its_blocks_and_nothing_else(name, monkeypatch):
    """R+n copies the last block n times, not what the block's hooks reach (the fusion's capture holds
    the container: copying it copied the whole model, a second model in memory while R+n was built,
    what the recipes' memory line did not count)."""
    copied = []
    for cls in (torch.Tensor, torch.nn.Parameter):
        original = cls.__deepcopy__
        monkeypatch.setattr(
            cls, "__deepcopy__", lambda self, memo, o=original: copied.append(self.nbytes) or o(self, memo)
        )
    base = FAMILIES[name].build("causal")
    last = find_encoder_blocks(base).blocks[-1]
    block_bytes = sum(t.nbytes for t in (*last.parameters(), *last.buffers()))
    adapted(base, ExtraLayersConfig(num_extra_layers=2, task_type=TASK_TYPES["causal"]))
    assert sum(copied) == 2 * block_bytes


def test_two_extra_layers_equal_the_model_with_two_more_blocks():
    family = FAMILIES["llama"]
    base = family.build("causal")
    model = adapted(copy.deepcopy(base), ExtraLayersConfig(num_extra_layers=2))
    assert [block.self_attn.layer_idx for block in fusion_of(model).blocks] == [2, 3]  # their own cache slots
    deeper = with_blocks_appended(family, base, list(fusion_of(model).blocks))
    inputs = inputs_for("causal", "right")
    torch.testing.assert_close(output_of(model, inputs), output_of(deeper, inputs), atol=ATOL, rtol=1e-5)


# ----------------------------------------------------------------------------- OPT-350m's layout
# `word_embed_proj_dim != hidden_size`: OPTDecoder maps the embeddings in (`project_in`) and the last
# state out (`project_out`), inside the container. OPT-350m is post-norm (no final norm): `project_out`
# reads z_L itself. The pre-norm variant has F before it.
OPT_LAYOUTS = {"post_norm_350m": False, "pre_norm": True}


def projected_opt(head: str, layer_norm_before: bool) -> torch.nn.Module:
    """A tiny OPT of width 32 whose embeddings and output are 16 wide (OPT-350m's layout, scaled down)."""
    config = tf.OPTConfig(**COMMON, ffn_dim=48, word_embed_proj_dim=16, num_labels=3,
                          do_layer_norm_before=layer_norm_before)  # fmt: skip
    torch.manual_seed(0)
    auto = {"causal": tf.AutoModelForCausalLM, "seq": tf.AutoModelForSequenceClassification}[head]
    return with_norm_gains(auto.from_config(config).eval())


def projected_stream(reference: torch.nn.Module, inputs: dict) -> list[torch.Tensor]:
    """``z_0 .. z_L`` of an untouched projected OPT: ``output_hidden_states`` for the block inputs, and
    ``z_L`` from what reads it after the blocks (the final norm, else ``project_out``)."""
    decoder = reference.model.decoder
    after_blocks = decoder.final_layer_norm or decoder.project_out
    seen = []
    handle = after_blocks.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            hidden = decoder(**inputs, output_hidden_states=True, use_cache=False).hidden_states
    finally:
        handle.remove()
    return [*hidden[: len(decoder.layers)], seen[-1]]


def projected_head_output(reference: torch.nn.Module, head: str, h: torch.Tensor, inputs: dict):
    """What the OPT makes of ``h`` in place of ``z_L``: its final norm (if any), ``project_out``, the head."""
    decoder = reference.model.decoder
    with torch.no_grad():
        if decoder.final_layer_norm is not None:
            h = decoder.final_layer_norm(h)
        h = decoder.project_out(h)  # (batch, seq, 16)
        if head == "causal":
            return reference.lm_head(h)
        logits = reference.score(h)
        last = last_real_index(inputs)
        return logits[torch.arange(len(last)), last]


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=[m.name for m in ENCODER_METHODS])
@pytest.mark.parametrize("head, side", [("causal", "right"), ("seq", "left")])
@pytest.mark.parametrize("layout", list(OPT_LAYOUTS))
def test_opt_with_an_output_projection_equals_the_recomputation(layout, head, side, method):
    """Issue 37 item 4: OPT-350m's layout was accepted, then every forward raised advising a
    `blocks_path` that was right. The fusion now runs at ``project_out``'s input (post-norm) or at
    the final norm (pre-norm), and ``project_out`` runs on the fused state as the model runs it."""
    reference = projected_opt(head, OPT_LAYOUTS[layout])
    assert reference.config.word_embed_proj_dim != reference.config.hidden_size
    model = adapted(copy.deepcopy(reference), method.make_config(task_type=TASK_TYPES[head]))
    assert fusion_of(model).hidden_size == 32  # the blocks' width, not the projected one
    inputs = inputs_for(head, side)
    if method.config_cls is ExtraLayersConfig:
        deeper = copy.deepcopy(reference)
        for block in fusion_of(model).blocks:
            deeper.model.decoder.layers.append(copy.deepcopy(block))
        expected = output_of(deeper, inputs)
    else:
        states = projected_stream(reference, inputs)
        h = REFERENCES[method.config_cls](states, list(range(1, len(states))), fusion_of(model))
        expected = projected_head_output(reference, head, h, inputs)
    got = output_of(model, inputs)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=1e-5)
    # the fusion changes what the head reads, far beyond the tolerance (OPT's small score head: logits ~0.01)
    assert (got - output_of(reference, inputs)).abs().max() > 10 * ATOL


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=[m.name for m in ENCODER_METHODS])
def test_opt_350m_layout_generates_with_the_cache_as_without(method):
    model = adapted(projected_opt("causal", False), method.make_config(task_type="CAUSAL_LM", **(
        {"num_extra_layers": 1} if method.config_cls is ExtraLayersConfig else {})))  # fmt: skip
    ids = token_ids(2, 5)
    tokens, scores = uncached_greedy(model, ids)
    out = cached_generate(model, input_ids=ids, attention_mask=torch.ones_like(ids))
    assert torch.equal(out.sequences[:, -NEW_TOKENS:], tokens)
    assert_scores_close(out.logits, scores)


def test_an_output_projection_whose_output_is_not_returned_raises():
    """The fusion at ``project_out``'s input holds only if the container returns that projection's output."""
    model = adapted(projected_opt("causal", False), DWAttConfig(task_type="CAUSAL_LM"))

    def copy_output(module: torch.nn.Module, args: tuple, output):
        output.last_hidden_state = output.last_hidden_state + 0  # equal values, not the projection's output
        return output

    model.base_model.model.model.decoder.register_forward_hook(copy_output, prepend=True)  # before ours
    one_line = r"fused at the input of its output projection `Linear`, but does not return"
    with pytest.raises(RuntimeError, match=one_line):
        output_of(model, inputs_for("causal", "right"))


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=[m.name for m in ENCODER_METHODS])
@pytest.mark.parametrize("name", NAMES)
def test_a_deleted_decoder_is_freed_at_once(name, method):
    """With the cyclic collector off, an adapted causal LM is freed when its last reference goes, after a
    training step, an evaluation forward and a cached generation (as the base model alone is)."""
    family, ids = FAMILIES[name], token_ids()

    def run(model: torch.nn.Module) -> None:
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        if loss.requires_grad:  # Average on a frozen LM head has nothing to train
            loss.backward()
        model.eval()
        output_of(model, {"input_ids": ids})
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)

    assert survivors(family.build, run) == []  # the control
    assert survivors(lambda: adapted(family.build(), method.make_config(task_type="CAUSAL_LM")), run) == []


@pytest.mark.parametrize("name", NAMES)
def test_discovery_finds_the_blocks_and_the_final_norm(name):
    family = FAMILIES[name]
    model = family.build("causal")
    located = find_encoder_blocks(model)
    assert located.blocks is family.blocks_of(model)
    assert any(norm is family.norm_of(model) for norm in located.final_norms)


def test_sequence_classification_reads_the_fused_state_at_the_last_real_token_only():
    # Changing a padding position's fused state cannot change the pooled logits; changing the
    # last real token's can. With left padding the last real token is the last position.
    family = FAMILIES["llama"]
    for side, last in (("right", 4), ("left", 6)):
        model = adapted(family.build("seq"), TOKEN_WISE[0].make_config(task_type="SEQ_CLS"))
        inputs = padded(side)  # row 1 has 5 real tokens of 7
        captured = {}
        norm = family.norm_of(model.base_model.model)

        def shift(position: int, module, args, output, captured=captured):
            output = output.clone()
            output[1, position] += 10.0
            captured["shifted"] = position
            return output

        plain = output_of(model, inputs)
        padding_position = 6 if side == "right" else 0
        for position, changes in ((padding_position, False), (last, True)):
            handle = norm.register_forward_hook(lambda m, a, o, p=position: shift(p, m, a, o))
            try:
                shifted = output_of(model, inputs)
            finally:
                handle.remove()
            assert torch.equal(shifted[0], plain[0])
            assert (not torch.equal(shifted[1], plain[1])) == changes, (side, position)


def test_seq2seq_methods_refuse_a_decoder_only_model():
    base = FAMILIES["llama"].build("causal")
    for method in SEQ2SEQ_METHODS:
        with pytest.raises(ValueError, match="not an encoder-decoder"):
            get_peft_model(copy.deepcopy(base), method.make_config())


def test_bert_as_a_decoder_is_accepted_and_recomputed():
    # A post-norm decoder (no final norm): the fused state is the formula on z_n itself.
    config = tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=48, is_decoder=True)  # fmt: skip
    torch.manual_seed(0)
    reference = tf.BertLMHeadModel(config).eval()
    method = TOKEN_WISE[0]
    model = adapted(copy.deepcopy(reference), method.make_config())
    ids = token_ids()
    with torch.no_grad():
        hidden = reference.bert(input_ids=ids, output_hidden_states=True).hidden_states
        expected = reference.cls(REFERENCES[method.config_cls](hidden, [1, 2], fusion_of(model)))
        torch.testing.assert_close(model(input_ids=ids).logits, expected, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("state_norm", ["none", "rms_after_norm"])
def test_fused_positions_on_a_pre_norm_decoder(state_norm):
    # Selected positions: the full fusion's output; the others: the base's F(z_L), bitwise. After the
    # final norm, the capture's F(z_L) is gathered at the selected positions as the states are.
    family = FAMILIES["llama"]
    config = TOKEN_WISE[0].make_config(task_type="TOKEN_CLS", state_norm=state_norm)
    model = adapted(family.build("token"), config)
    inputs = inputs_for("token", "right")
    mask = torch.zeros_like(inputs["input_ids"], dtype=torch.bool)
    mask[0, 2] = mask[1, 5] = True
    full = output_of(model, inputs)
    with fused_positions(model, mask):
        partial = output_of(model, inputs)
    with model.disable_adapter():
        plain = output_of(model, inputs)
    torch.testing.assert_close(partial[mask], full[mask], atol=1e-6, rtol=1e-6)
    assert torch.equal(partial[~mask], plain[~mask])
    assert (full[mask] - plain[mask]).abs().max() > 1e-3


@pytest.mark.parametrize("config_cls", [TOKEN_WISE[0].config_cls, ExtraLayersConfig])
@pytest.mark.parametrize("use_reentrant", [None, True, False], ids=["plain", "reentrant", "non-reentrant"])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_gradient_checkpointing_gives_the_same_gradients_on_a_pre_norm_decoder(
    name, config_cls, use_reentrant
):
    # The final norm is found by data flow (the last block's output tensor): checkpointed blocks
    # must still hand it over, and gradients must reach the fusion and the trained blocks alike.
    # Fusion + LoRA in one adapter, LoRA on the family's attention projections (GPT-2: its Conv1D).
    family = FAMILIES[name]

    def gradients(use_reentrant):
        model = adapted(family.build("token"), config_cls(task_type="TOKEN_CLS", **family.lora()))
        if use_reentrant is not None:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": use_reentrant}
            )
            model.enable_input_require_grads()  # LoRA in re-entrant checkpointed blocks (4.57 leaves it out)
        model.train()
        inputs = inputs_for("token", "right")
        labels = torch.arange(14).view(2, 7) % 3
        model(**inputs, labels=labels, use_cache=False).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    plain, checkpointed = gradients(None), gradients(use_reentrant)
    assert any("fusion" in key for key in plain) and any("lora" in key for key in plain)
    assert plain.keys() == checkpointed.keys()
    for key, grad in plain.items():
        torch.testing.assert_close(checkpointed[key], grad, atol=1e-6, rtol=1e-5, msg=key)
        assert "lora_A" in key or grad.abs().max() > 0, key  # (LoRA's B starts at zero: A gets none yet)


def test_a_causal_lm_head_left_frozen_is_not_warned_about_a_classifier_head_is():
    # An LM head stays frozen under PEFT (as with LoRA); a fresh classification head must train.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        get_peft_model(FAMILIES["llama"].build("causal"), TOKEN_WISE[0].make_config())
    assert not [w for w in caught if "task head" in str(w.message)]
    with pytest.warns(UserWarning, match=r"no parameter of the task head \['score'\] trains"):
        get_peft_model(FAMILIES["llama"].build("seq"), TOKEN_WISE[0].make_config())
