"""Cached generation with a fusion equals uncached forwards (issue 26 item 2, issue 24 item 5).

For every decoder family (``tiny_decoders.py``) and every encoder method (token-wise ones and
R+n, whose extra blocks get cache slots of their own): ``generate()`` with the key/value cache
gives the same tokens, and scores within float tolerance, as

* greedy: a full forward without cache over the whole prefix at every step (written out here);
* beam search and a left-padded batch: ``generate(use_cache=False)`` (full forwards each step).

Sliding-window attention runs with a window (4) smaller than the sequence (Mistral, Gemma 3).
Decoder stacks of encoder-decoder models named with ``blocks_path`` (T5's ``decoder.block``,
BART's ``decoder.layers``) are exact the same way.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf
from tiny_decoders import EOS, FAMILIES, NAMES, WINDOW, adapted, padded, token_ids
from torch.utils._python_dispatch import TorchDispatchMode

from peft_layerfusion import ExtraLayersConfig
from peft_layerfusion.registration import ENCODER_METHODS

METHOD_IDS = [method.name for method in ENCODER_METHODS]
NEW_TOKENS = 5
ATOL = 1e-4


def no_eos(model: torch.nn.Module) -> dict:
    """Generation settings that run exactly ``NEW_TOKENS`` steps (EOS never ends a sequence early)."""
    return {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "do_sample": False, "pad_token_id": 0}


def config_for(method, **options):
    if method.config_cls is ExtraLayersConfig:
        options["num_extra_layers"] = 1
    return method.make_config(task_type="CAUSAL_LM", **options)


def adapted_with(base: torch.nn.Module, method, **options) -> torch.nn.Module:
    return adapted(base, config_for(method, **options), scale=0.3)


def uncached_greedy(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding by uncached full forwards: ``(new tokens (batch, T), logits (T, batch, vocab))``."""
    scores = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=ids, use_cache=False).logits[:, -1]  # (batch, vocab)
            scores.append(logits)
            allowed = logits.clone()
            allowed[:, EOS] = -torch.inf  # as min_new_tokens does in generate()
            ids = torch.cat([ids, allowed.argmax(-1, keepdim=True)], dim=1)
    return ids[:, -NEW_TOKENS:], torch.stack(scores)


def cached_generate(model: torch.nn.Module, **inputs):
    with torch.no_grad():
        return model.generate(**inputs, **no_eos(model), use_cache=True, output_logits=True,
                              return_dict_in_generate=True)  # fmt: skip


def assert_scores_close(cached: tuple[torch.Tensor, ...] | torch.Tensor, uncached: torch.Tensor) -> None:
    """Logits of every step (before any logits processor), or beam scores, within float tolerance."""
    cached = torch.stack(cached) if isinstance(cached, tuple) else cached
    torch.testing.assert_close(cached, uncached, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("name", NAMES)
def test_cached_greedy_equals_uncached_forwards(name, method):
    family = FAMILIES[name]
    model = adapted_with(family.build("causal"), method)
    ids = token_ids(2, 7 if family.sliding else 5)  # longer than the window when there is one
    tokens, scores = uncached_greedy(model, ids)
    out = cached_generate(model, input_ids=ids, attention_mask=torch.ones_like(ids))
    assert torch.equal(out.sequences[:, -NEW_TOKENS:], tokens)
    assert_scores_close(out.logits, scores)
    plain_tokens, plain_scores = uncached_greedy(family.build("causal"), ids)
    assert (plain_scores - scores).abs().max() > 1e-3  # the fusion steers the generation


DEPTH_MIXES = [method for method in ENCODER_METHODS if "state_norm" in method.config_cls.__dataclass_fields__]


@pytest.mark.parametrize("method", DEPTH_MIXES, ids=[method.name for method in DEPTH_MIXES])
@pytest.mark.parametrize("name", ["llama", "gemma3_text"])
def test_a_mix_where_the_head_reads_generates_exactly(name, method):
    """``state_norm="rms_after_norm"``: the mix replaces F(z_L), at every decoding step as uncached."""
    family = FAMILIES[name]
    model = adapted_with(family.build("causal"), method, state_norm="rms_after_norm")
    ids = token_ids(2, 7 if family.sliding else 5)
    tokens, scores = uncached_greedy(model, ids)
    out = cached_generate(model, input_ids=ids, attention_mask=torch.ones_like(ids))
    assert torch.equal(out.sequences[:, -NEW_TOKENS:], tokens)
    assert_scores_close(out.logits, scores)


class HostDataCounter(TorchDispatchMode):
    """Counts the ops that move data between host and device: ``_local_scalar_dense`` (``.item()``,
    ``bool(tensor)``: on a GPU the host waits for every queued kernel) and ``lift_fresh`` (a tensor
    made from host data: a copy to the device)."""

    OPS = ("aten._local_scalar_dense.default", "aten.lift_fresh.default")

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        self.count += str(func) in self.OPS
        return func(*args, **(kwargs or {}))


def host_data_ops(model: torch.nn.Module, ids: torch.Tensor) -> tuple[int, int]:
    """Host-data ops of a training forward and backward over ``ids``, and of one cached decoding step."""
    with HostDataCounter() as training:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        if loss.requires_grad:  # Average on a frozen model trains nothing
            loss.backward()
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        with HostDataCounter() as step:
            model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True)
    return training.count, step.count


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("name", ["llama", "gemma3_text"])
def test_a_fusion_adds_no_host_sync_to_a_forward(name, method):
    """What the model's own forward syncs, and no more: on a GPU a decoding step at batch 1 is bound by
    launches, and one ``.item()`` per step stalls them (ScalarMix's one-hot start did, twice)."""
    family = FAMILIES[name]
    base = family.build("causal")
    ids = token_ids(2, 5)
    model = adapted_with(copy.deepcopy(base), method).train()
    assert host_data_ops(model, ids) == host_data_ops(base.train(), ids)


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("name", NAMES)
def test_cached_beam_search_and_left_padded_batch_equal_uncached(name, method):
    family = FAMILIES[name]
    model = adapted_with(family.build("causal"), method)
    settings = {**no_eos(model), "output_logits": True, "return_dict_in_generate": True}
    ids = token_ids(2, 7)
    with torch.no_grad():
        beams = {cache: model.generate(input_ids=ids, num_beams=3, use_cache=cache, **settings)
                 for cache in (True, False)}  # fmt: skip
    assert torch.equal(beams[True].sequences, beams[False].sequences)
    assert_scores_close(beams[True].sequences_scores, beams[False].sequences_scores)
    batch = padded("left", lengths=(7, 4))
    with torch.no_grad():
        runs = {cache: model.generate(**batch, use_cache=cache, **settings) for cache in (True, False)}
    assert torch.equal(runs[True].sequences, runs[False].sequences)
    assert_scores_close(runs[True].logits, torch.stack(runs[False].logits))


@pytest.mark.parametrize("name", [name for name in NAMES if FAMILIES[name].sliding])
def test_sliding_window_is_smaller_than_the_sequence(name):
    # The generation tests above would not see a window that never slides.
    config = FAMILIES[name].config()
    assert config.sliding_window == WINDOW < 7 + NEW_TOKENS


def test_extra_layers_keep_their_own_cache_slots():
    model = adapted_with(FAMILIES["gemma3_text"].build("causal"), method_named_extra())
    ids = token_ids(1, 7)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    assert len(cache.layers) == 3  # the model's 2 slots and the extra block's own
    # the extra block is a copy of the last (full-attention) block: its slot is of the same kind
    assert type(cache.layers[2]) is type(cache.layers[1])
    assert cache.layers[2].keys.shape == cache.layers[1].keys.shape


def method_named_extra():
    return next(method for method in ENCODER_METHODS if method.config_cls is ExtraLayersConfig)


def test_extra_layers_refuse_a_cache_they_cannot_extend_in_one_line():
    model = adapted_with(FAMILIES["llama"].build("causal"), method_named_extra())

    class FixedCache(tf.DynamicCache):
        """A cache whose layers need a setting the extra slot cannot read back."""

    cache = FixedCache(config=model.config)
    cache.layers = [Opaque(1), Opaque(2)]
    one_line = r"^R\+n \(extra_layers\) cannot give its 1 extra blocks .* use_cache=False\.$"
    with pytest.raises(ValueError, match=one_line):
        model(input_ids=token_ids(1, 4), past_key_values=cache, use_cache=True)


class Opaque(tf.cache_utils.DynamicLayer):
    def __init__(self, secret: int) -> None:  # stored under another name: cannot be read back
        super().__init__()
        self._hidden_setting = secret


# ----------------------------------------------------------------------------- encoder-decoders' decoders
def tiny_t5() -> tf.T5ForConditionalGeneration:
    torch.manual_seed(0)
    config = tf.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                         decoder_start_token_id=0, pad_token_id=0, eos_token_id=EOS)  # fmt: skip
    return tf.T5ForConditionalGeneration(config).eval()


def tiny_bart() -> tf.BartForConditionalGeneration:
    torch.manual_seed(0)
    config = tf.BartConfig(vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                           decoder_ffn_dim=48, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                           eos_token_id=EOS, decoder_start_token_id=EOS)  # fmt: skip
    return tf.BartForConditionalGeneration(config).eval()


DECODER_STACKS = {"t5": (tiny_t5, "decoder.block"), "bart": (tiny_bart, "decoder.layers")}


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("stack", list(DECODER_STACKS))
def test_decoder_stack_of_an_encoder_decoder_generates_exactly(stack, method):
    build, blocks_path = DECODER_STACKS[stack]
    base = build()
    options = {"num_extra_layers": 1} if method.config_cls is ExtraLayersConfig else {}
    model = adapted(copy.deepcopy(base), method.make_config(blocks_path=blocks_path, **options), scale=0.3)
    src = token_ids(2, 6)
    settings = {**no_eos(model), "output_logits": True, "return_dict_in_generate": True}
    greedy = {}
    with torch.no_grad():
        for beams in (1, 3):
            runs = {cache: model.generate(input_ids=src, num_beams=beams, use_cache=cache, **settings)
                    for cache in (True, False)}  # fmt: skip
            assert torch.equal(runs[True].sequences, runs[False].sequences), beams
            torch.testing.assert_close(torch.stack(runs[True].logits), torch.stack(runs[False].logits),
                                       atol=ATOL, rtol=1e-4)  # fmt: skip
            greedy = greedy or runs
        plain = base.generate(input_ids=src, use_cache=True, **settings)
    assert (torch.stack(plain.logits) - torch.stack(greedy[True].logits)).abs().max() > 1e-3


@pytest.mark.parametrize("method", ENCODER_METHODS, ids=METHOD_IDS)
def test_a_bart_decoder_alone_generates_exactly(method):
    # BartForCausalLM: a post-norm decoder (no final norm), found by the generic `layers` suffix.
    torch.manual_seed(0)
    config = tf.BartConfig(vocab_size=100, d_model=32, decoder_layers=2, decoder_attention_heads=4,
                           decoder_ffn_dim=48, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                           eos_token_id=EOS, forced_eos_token_id=None, is_decoder=True,
                           is_encoder_decoder=False)  # fmt: skip
    model = adapted_with(tf.BartForCausalLM(config).eval(), method)
    ids = token_ids(2, 5)
    tokens, scores = uncached_greedy(model, ids)
    out = cached_generate(model, input_ids=ids, attention_mask=torch.ones_like(ids))
    assert torch.equal(out.sequences[:, -NEW_TOKENS:], tokens)
    assert_scores_close(out.logits, scores)


@pytest.mark.parametrize("name", ["llama", "gemma3_text", "mistral"])
def test_extra_layers_with_a_static_cache_equal_uncached(name):
    # cache_implementation="static": the extra slot is a StaticLayer of the same max_cache_len; on an
    # all-sliding model (Mistral, issue 37) a StaticSlidingWindowLayer of the same window (it keeps
    # only that length, which was refused as "cannot read `sliding_window`").
    model = adapted_with(FAMILIES[name].build("causal"), method_named_extra())
    ids = token_ids(2, 7)
    settings = {**no_eos(model), "output_logits": True, "return_dict_in_generate": True}
    with torch.no_grad():
        static = model.generate(input_ids=ids, cache_implementation="static", **settings)
        dynamic = model.generate(input_ids=ids, use_cache=True, **settings)
        uncached = model.generate(input_ids=ids, use_cache=False, **settings)
    assert torch.equal(static.sequences, uncached.sequences)
    assert torch.equal(dynamic.sequences, uncached.sequences)
    assert_scores_close(static.logits, torch.stack(uncached.logits))
    assert_scores_close(dynamic.logits, torch.stack(uncached.logits))


# a sliding-window last block: Mistral (every block), Gemma 3 with its layer types swapped
SLIDING_LAST = {"mistral": {}, "gemma3_text": {"layer_types": ["full_attention", "sliding_attention"]}}


@pytest.mark.parametrize("decoding", ["prompt_lookup", "assisted"])
@pytest.mark.parametrize("name", list(SLIDING_LAST))
def test_extra_layers_on_a_sliding_last_block_decode_assisted_and_by_prompt_lookup(name, decoding):
    """Issue 37 item 5: assisted and prompt-lookup decoding crop the cache back after rejected
    candidates, which a sliding-window layer allows only once ``generate`` turned on its past
    recording; the extra block's new slot did not record ("crop was called, but the current layer
    does not track past states"). Now the tokens equal plain greedy cached generation."""
    base = FAMILIES[name].build("causal", **SLIDING_LAST[name])
    assert getattr(base.config, "layer_types", ["sliding_attention"])[-1] == "sliding_attention"
    model = adapted_with(copy.deepcopy(base), method_named_extra())
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])  # repeats: prompt lookup finds candidates
    extra = {"prompt_lookup_num_tokens": 3} if decoding == "prompt_lookup" else {"assistant_model": base}
    # transformers 4's assisted decoding refuses a minimum length: an EOS id beyond the vocabulary instead
    settings = {**no_eos(model), "min_new_tokens": None, "eos_token_id": base.config.vocab_size}
    with torch.no_grad():
        greedy = model.generate(input_ids=ids, use_cache=True, **settings)
        got = model.generate(input_ids=ids, use_cache=True, **settings, **extra)
    assert got.shape[1] == ids.shape[1] + NEW_TOKENS and torch.equal(got, greedy)
    tokens, _ = uncached_greedy(model, ids)
    assert torch.equal(greedy[:, -NEW_TOKENS:], tokens)
