"""Generation on encoder-decoder models: cached ``generate()`` equals uncached step-by-step forwards.

Issue 24, items 1 and 4. Every encoder-fusion method of the registry fuses BART's and T5's
encoder output; ``generate()`` (greedy and beam search, with ``encoder_outputs=`` given or not)
must choose exactly the tokens that teacher-forced full forwards over the growing sequence
choose (argmax, or a beam search recomputed here from those forwards). A SurfaceFusion adapter
deleted after it generated must leave nothing behind in ``generate``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import fusion_of, perturb_
from peft import get_peft_model
from test_surface_fusion import BUILDERS, batch

from peft_layerfusion import SurfaceFusionConfig
from peft_layerfusion.registration import ENCODER_METHODS

STEPS, BEAMS = 4, 3


def source() -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch().items() if k != "labels"}  # input_ids, attention_mask (a padded row)


def generate_options(**extra) -> dict:
    return dict(max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, **extra)


# ------------------------------------------------------------------- encoder fusion on BART and T5 (item 1)
def fused_model(family: str, method):
    base = BUILDERS[family]()
    torch.manual_seed(0)
    model = get_peft_model(copy.deepcopy(base), method.make_config()).eval()
    perturb_(fusion_of(model), scale=0.3, seed=5)
    return model, base


def step_log_probs(model, inputs: dict, sequences: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the next token after each row of ``sequences``: one full forward, no cache.

    The source rows are repeated to the rows of ``sequences`` (beams); the end-of-sequence token
    is masked as ``min_new_tokens`` masks it in ``generate``.
    """
    repeats = sequences.shape[0] // inputs["input_ids"].shape[0]
    source_rows = {k: v.repeat_interleave(repeats, 0) for k, v in inputs.items()}
    with torch.no_grad():
        output = model(**source_rows, decoder_input_ids=sequences, use_cache=False)
    logits = output.logits[:, -1]  # (rows, vocab)
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    log_probs[:, model.config.eos_token_id] = -float("inf")
    return log_probs


def start_tokens(model, rows: int) -> torch.Tensor:
    return torch.full((rows, 1), model.config.decoder_start_token_id, dtype=torch.long)


def greedy_reference(model, inputs: dict) -> torch.Tensor:
    """Argmax after argmax, each from a teacher-forced full forward over the sequence so far."""
    sequences = start_tokens(model, inputs["input_ids"].shape[0])
    for _ in range(STEPS):
        next_tokens = step_log_probs(model, inputs, sequences).argmax(-1, keepdim=True)  # (rows, 1)
        sequences = torch.cat([sequences, next_tokens], dim=1)
    return sequences


def beam_reference(model, inputs: dict, beams: int = BEAMS) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam search recomputed from full forwards: ``(best sequence per row, its summed log-prob)``."""
    rows = inputs["input_ids"].shape[0]
    sequences = start_tokens(model, rows * beams)  # (rows * beams, length)
    scores = torch.full((rows, beams), -1e9)
    scores[:, 0] = 0.0  # at the start every beam holds the same prefix: count it once
    for _ in range(STEPS):
        log_probs = step_log_probs(model, inputs, sequences).view(rows, beams, -1)
        candidates = (scores[:, :, None] + log_probs).flatten(1)  # (rows, beams * vocab)
        scores, chosen = candidates.topk(beams, dim=1)  # (rows, beams)
        vocab = log_probs.shape[-1]
        origin = (chosen // vocab + torch.arange(rows)[:, None] * beams).flatten()
        sequences = torch.cat([sequences[origin], (chosen % vocab).flatten()[:, None]], dim=1)
    return sequences.view(rows, beams, -1)[:, 0], scores[:, 0]


def encoder_outputs_of(model, inputs: dict):
    with torch.no_grad():
        return model.get_encoder()(**inputs)


@pytest.mark.parametrize("search", ["greedy", "beam"])
@pytest.mark.parametrize("given", [False, True], ids=["input_ids", "encoder_outputs"])
@pytest.mark.parametrize("method", ENCODER_METHODS, ids=[m.name for m in ENCODER_METHODS])
@pytest.mark.parametrize("family", list(BUILDERS))
def test_generate_equals_uncached_step_by_step_search(family, method, given, search):
    model, base = fused_model(family, method)
    inputs = source()
    call = {"encoder_outputs": encoder_outputs_of(model, inputs), "attention_mask": inputs["attention_mask"]}
    beam = search == "beam"
    options = generate_options(num_beams=BEAMS, length_penalty=0.0) if beam else generate_options()
    with torch.no_grad():
        got = model.generate(
            **(call if given else inputs), **options, output_scores=True, return_dict_in_generate=True
        )
    if beam:  # the beams and their summed log-probabilities (length_penalty 0)
        expected, expected_scores = beam_reference(model, inputs)
        torch.testing.assert_close(got.sequences_scores, expected_scores, atol=1e-4, rtol=1e-5)
    else:
        expected = greedy_reference(model, inputs)
    assert torch.equal(got.sequences, expected)
    fused_steps, plain_steps = step_log_probs(model, inputs, expected), step_log_probs(base, inputs, expected)
    finite = torch.isfinite(plain_steps)
    assert (fused_steps[finite] - plain_steps[finite]).abs().max() > 1e-4  # the fusion reaches the decoder


def test_decoding_states_the_adapter_did_not_fuse_is_refused():
    method = ENCODER_METHODS[0]
    model, base = fused_model("bart", method)
    inputs = source()
    mask = inputs["attention_mask"]
    with model.disable_adapter():
        unfused = encoder_outputs_of(model, inputs)
    stale = encoder_outputs_of(model, inputs)
    encoder_outputs_of(model, {k: v[:1] for k, v in inputs.items()})  # a later encoder call
    foreign = encoder_outputs_of(base, inputs)
    with torch.no_grad():
        for outputs in (unfused, stale, foreign):
            for beams in (1, BEAMS):
                with pytest.raises(RuntimeError, match="did not fuse"):
                    model.generate(encoder_outputs=copy.deepcopy(outputs), attention_mask=mask,
                                   **generate_options(num_beams=beams))  # fmt: skip
            with pytest.raises(RuntimeError, match="did not fuse"):
                model(encoder_outputs=outputs, attention_mask=mask, decoder_input_ids=start_tokens(model, 2))
        with model.disable_adapter():  # disabled: the base's own decoding, no check
            plain = model.generate(encoder_outputs=unfused, attention_mask=mask, **generate_options())
        assert torch.equal(plain, base.generate(**inputs, **generate_options()))


def test_encoder_outputs_of_another_adapter_are_refused():
    method = ENCODER_METHODS[0]
    model, _ = fused_model("t5", method)
    model.add_adapter("other", method.make_config())
    inputs = source()
    outputs = encoder_outputs_of(model, inputs)  # fused by "default"
    model.set_adapter("other")
    with torch.no_grad(), pytest.raises(RuntimeError, match="'other'.*did not fuse"):
        model.generate(encoder_outputs=outputs, attention_mask=inputs["attention_mask"], **generate_options())


# ------------------------------------------------------------------- a deleted SurfaceFusion (item 4)
def surface_model(base, fusion: str, seed: int):
    model = get_peft_model(copy.deepcopy(base), SurfaceFusionConfig(fusion=fusion)).eval()
    perturb_(fusion_of(model), scale=0.3, seed=seed)
    return model


@pytest.mark.parametrize("deleted_first", [True, False], ids=["wrapped-first", "wrapped-last"])
def test_a_deleted_surface_fusion_adapter_leaves_generate(deleted_first):
    base = BUILDERS["bart"]()
    options = generate_options(num_beams=BEAMS, output_scores=True, return_dict_in_generate=True)
    kinds = {"default": "hard", "b": "soft"}
    model = surface_model(base, kinds["default"], seed=1)
    model.add_adapter("b", SurfaceFusionConfig(fusion=kinds["b"]))
    perturb_(fusion_of(model, "b"), scale=0.3, seed=2)
    gone, kept = ("default", "b") if deleted_first else ("b", "default")
    alone = surface_model(base, kinds[kept], seed=0)  # the model that only ever had `kept`, same weights
    fusion_of(alone).load_state_dict(fusion_of(model, kept).state_dict())
    with torch.no_grad():
        model.set_adapter(gone)
        model.generate(**source(), **options)  # `gone` keeps its last normaliser
        model.set_adapter(kept)
        model.delete_adapter(gone)
        got = model.generate(**source(), **options)
        expected = alone.generate(**source(), **options)
    assert torch.equal(got.sequences, expected.sequences)
    torch.testing.assert_close(got.sequences_scores, expected.sequences_scores, atol=1e-6, rtol=1e-6)
    model.delete_adapter(kept)
    assert "generate" not in vars(model.base_model.model)  # the class's own generate again
