"""SurfaceFusion on tiny random BART and T5: formula, generate(), gradients, lifecycle."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import check_lifecycle
from peft import PeftModel, get_peft_model
from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration

from peft_layerfusion import SurfaceFusionConfig, count_hooks
from peft_layerfusion.layer import fusion_layer_of

VOCAB = 40


def tiny_bart(seed: int = 0) -> BartForConditionalGeneration:
    """2+2 layers, width 16, larger init than BART's 0.02 so every path visibly matters."""
    torch.manual_seed(seed)
    config = BartConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
        init_std=0.3, scale_embedding=True,
    )  # fmt: skip
    return BartForConditionalGeneration(config).eval()


def tiny_t5(seed: int = 0) -> T5ForConditionalGeneration:
    """2+2 T5 blocks, width 16, tied embeddings (T5 v1.0 style)."""
    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, initializer_factor=3.0,
    )  # fmt: skip
    return T5ForConditionalGeneration(config).eval()


BUILDERS = {"bart": tiny_bart, "t5": tiny_t5}


def batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(3, VOCAB, (2, 6), generator=generator)
    mask = torch.ones_like(input_ids)
    mask[1, 4:] = 0  # a padded source row: the attention must ignore it
    labels = torch.randint(3, VOCAB, (2, 4), generator=generator)
    labels[1, 3] = -100
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def adapted(base, **options) -> PeftModel:
    model = get_peft_model(copy.deepcopy(base), SurfaceFusionConfig(**options)).eval()
    module = fusion_module(model)
    with torch.no_grad():  # non-zero FFN output layer, so the FFN path is exercised
        if hasattr(module, "ffn_down"):
            module.ffn_down.weight.normal_(0, 0.3)
        if hasattr(module, "lambda_gate"):
            module.lambda_gate.weight.normal_(0, 0.3)
    return model


def fusion_module(model: PeftModel):
    return fusion_layer_of(model.base_model.model).fusion_modules["default"]


def reference_log_probs(base, module, inputs: dict, decoder_input_ids: torch.Tensor, options: dict):
    """The METHODS.md formulas, recomputed from the base model's public outputs."""
    out = base(
        input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
        decoder_input_ids=decoder_input_ids, output_hidden_states=True,
    )  # fmt: skip
    d = base.config.d_model
    is_t5 = base.config.model_type == "t5"
    s = out.decoder_hidden_states[-1] * (d**-0.5 if is_t5 else 1.0)  # T5 scales before its tied head
    x_last = out.encoder_last_hidden_state
    E = base.get_input_embeddings().weight
    x0 = (1.0 if is_t5 else math.sqrt(d)) * E[inputs["input_ids"]]
    att = module.attention
    q, k, v = (
        F.linear(s, att.query.weight, att.query.bias),
        F.linear(x_last, att.key.weight, att.key.bias),
        None,
    )
    v = F.linear(x0, att.value.weight, att.value.bias)
    scores = q @ k.transpose(1, 2) / math.sqrt(d)
    scores = scores.masked_fill(inputs["attention_mask"][:, None, :] == 0, -1e30)
    e = F.linear(torch.softmax(scores, -1) @ v, att.output.weight, att.output.bias)
    z_n = out.logits
    if options.get("use_ffn", True):

        def ffn(x):
            return module.ffn_down(torch.relu(module.ffn_up(x)))

        z_n = z_n + ffn(s) @ E.T
        s, e = s + ffn(s), e + ffn(e)
    z_e = e @ E.T
    if options.get("fusion", "hard") == "soft":
        return torch.log_softmax(z_n + torch.log_softmax(options.get("temperature", 1.0) * z_e, -1), -1)
    lam = options.get("fusion_lambda", 0.8)
    if options.get("learn_lambda"):
        lam = torch.sigmoid(torch.cat([s, e], -1) @ module.lambda_gate.weight.T + module.lambda_gate.bias)
    return lam * torch.log_softmax(z_n, -1) + (1 - lam) * torch.log_softmax(z_e, -1)


OPTIONS = [
    {},
    {"fusion": "soft", "temperature": 0.5},
    {"learn_lambda": True, "fusion_lambda": 0.7},
    {"fusion_lambda": 0.3, "use_ffn": False},
]


@pytest.mark.parametrize("family", ["bart", "t5"])
@pytest.mark.parametrize("options", OPTIONS, ids=["hard", "soft", "learned", "noffn"])
def test_fused_log_probs_and_loss_match_the_formulas(family, options):
    base = BUILDERS[family]()
    model = adapted(base, **options)
    inputs = batch()
    with torch.no_grad():
        out = model(**inputs)
        decoder_input_ids = base.prepare_decoder_input_ids_from_labels(labels=inputs["labels"])
        expected = reference_log_probs(base, fusion_module(model), inputs, decoder_input_ids, options)
        plain = base(**inputs)
    torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=1e-5)
    assert (out.logits - plain.logits).abs().max() > 1e-2  # the fusion really changed the distribution
    labels = inputs["labels"]
    kept = labels != -100
    nll = -expected.gather(-1, labels.clamp(min=0)[..., None])[..., 0][kept].mean()
    torch.testing.assert_close(out.loss, nll, atol=1e-5, rtol=1e-5)
    if options.get("fusion") == "soft":  # normalised; hard fusion is not
        torch.testing.assert_close(out.logits.logsumexp(-1), torch.zeros(2, 4), atol=1e-5, rtol=0)
    else:
        assert out.logits.logsumexp(-1).max() < -1e-4


def test_padded_source_positions_are_ignored():
    base = tiny_bart()
    model = adapted(base)
    inputs = batch()
    changed = {**inputs, "input_ids": inputs["input_ids"].clone()}
    changed["input_ids"][1, 5] = 7  # a padded position of row 1
    with torch.no_grad():
        first, second = model(**inputs).logits, model(**changed).logits
    assert torch.equal(first[1], second[1])


@pytest.mark.parametrize("family", ["bart", "t5"])
@pytest.mark.parametrize("fusion", ["soft", "hard"])
def test_beam_search_scores_are_the_fused_distribution(family, fusion):
    base = BUILDERS[family]()
    model = adapted(base, fusion=fusion)
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    beams = 3
    with torch.no_grad():
        generated = model.generate(
            **inputs, num_beams=beams, max_new_tokens=3, min_new_tokens=3, do_sample=False,
            length_penalty=0.0,
            output_scores=True, output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
        start = torch.full((2, 1), base.config.decoder_start_token_id)
        expected = reference_log_probs(base, fusion_module(model), inputs, start, {"fusion": fusion})[:, -1]
    # Step 0: every beam of a row sees the same prefix; the model's output is the fused log p.
    torch.testing.assert_close(generated.logits[0][::beams], expected, atol=1e-5, rtol=1e-5)
    # ... and so are the beam scores (hard fusion is not normalised: log_softmax alone would shift them).
    normaliser = expected.logsumexp(-1)
    assert (
        (normaliser < -1e-3).all()
        if fusion == "hard"
        else torch.allclose(normaliser, torch.zeros(2), atol=1e-5)
    )
    scores = generated.scores[0][::beams]
    allowed = torch.isfinite(scores)  # min_new_tokens masks EOS with -inf
    assert allowed.sum() == scores.numel() - 2
    torch.testing.assert_close(scores[allowed], expected[allowed], atol=1e-5, rtol=1e-5)
    assert generated.sequences.shape == (2, 4)
    # Later steps (cached decoder, beams expanded) agree with a full forward over the chosen prefix.
    with torch.no_grad():
        full = model(**{k: v.repeat_interleave(beams, 0) for k, v in inputs.items()},
                     decoder_input_ids=generated.sequences[:, :2].repeat_interleave(beams, 0))  # fmt: skip
    torch.testing.assert_close(
        full.logits[::beams, -1], _beam_logits_of(generated, beams), atol=1e-4, rtol=1e-4
    )
    # The final beam score (length_penalty 0: the sum) is the fused log p of the chosen tokens.
    sequences = generated.sequences
    with torch.no_grad():
        teacher_forced = model(**inputs, decoder_input_ids=sequences[:, :-1]).logits  # (batch, 3, vocab)
    chosen = teacher_forced.gather(-1, sequences[:, 1:, None]).squeeze(-1).sum(-1)  # (batch,)
    torch.testing.assert_close(generated.sequences_scores, chosen, atol=1e-4, rtol=1e-4)


def _beam_logits_of(generated, beams: int) -> torch.Tensor:
    """Step-1 logits of the beam that the best final sequence extends (per batch row)."""
    rows = []
    for row in range(generated.sequences.shape[0]):
        beam = generated.beam_indices[row, 1].item()
        rows.append(generated.logits[1][beam])
    return torch.stack(rows)


def test_greedy_generate_follows_the_fused_argmax():
    base = tiny_bart()
    model = adapted(base, fusion="soft")
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    with torch.no_grad():
        sequences = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        plain = base.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        logits = model(**inputs, decoder_input_ids=sequences[:, :-1]).logits
    assert torch.equal(sequences[:, 1:], logits.argmax(-1))
    assert not torch.equal(sequences, plain)


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_gradients_never_reach_the_detached_query_and_key_paths(family):
    base = BUILDERS[family]()
    model = adapted(base, fusion_lambda=0.0)  # log p = log_softmax(z_E): only the embedding path
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    model(**batch()).loss.backward()
    inner = model.base_model.model
    named = [(f".{n}", p) for n, p in inner.named_parameters()]
    encoder_blocks = [
        p for n, p in named if ".encoder." in n and "layer_fusion" not in n and "embed_tokens" not in n
    ]
    decoder_blocks = [p for n, p in named if ".decoder." in n and "embed_tokens" not in n]
    assert encoder_blocks and decoder_blocks
    assert all(p.grad is None or not p.grad.any() for p in encoder_blocks + decoder_blocks)
    module = fusion_module(model)
    for parameter in (
        module.attention.query.weight,
        module.attention.key.weight,
        module.attention.value.weight,
    ):
        assert parameter.grad.abs().sum() > 0
    assert base.get_input_embeddings().weight is not inner.get_input_embeddings().weight
    assert inner.get_input_embeddings().weight.grad.abs().sum() > 0  # values x0 and z_E = e·Eᵀ


def test_learned_lambda_starts_at_its_value_and_gets_gradients():
    model = get_peft_model(tiny_bart(), SurfaceFusionConfig(learn_lambda=True, fusion_lambda=0.8))
    module = fusion_module(model)
    assert torch.sigmoid(module.lambda_gate.bias).item() == pytest.approx(0.8)
    model(**batch()).loss.backward()
    assert module.lambda_gate.weight.grad.abs().sum() > 0 and module.lambda_gate.bias.grad.abs() > 0


def test_lifecycle_save_load_disable_unload_merge(tmp_path):
    base = tiny_bart()
    hooks_before = count_hooks(base)
    inputs = batch()
    with torch.no_grad():
        plain = base(**inputs).logits
    model = adapted(base, fusion="soft")
    assert "generate" in vars(model.base_model.model)  # the beam-score wrapper, see FusedBeamScores
    check_lifecycle(model, tiny_bart(), inputs, tmp_path, plain, hooks_before)
    assert "generate" not in vars(model.unload())  # unload() restores the class's generate


def test_stale_encoder_outputs_are_refused():
    model = adapted(tiny_bart())
    inputs = batch()
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=inputs["input_ids"][:1])
        model(**inputs)  # the fusion now remembers another encoder run
        with pytest.raises(RuntimeError, match="did not see being computed"):
            model(encoder_outputs=encoder_outputs, labels=inputs["labels"][:1])


def test_untied_models_and_bad_options_are_refused():
    with pytest.raises(ValueError, match="`fusion`='mean'"):
        SurfaceFusionConfig(fusion="mean")
    with pytest.raises(ValueError, match="fusion_lambda"):
        SurfaceFusionConfig(learn_lambda=True, fusion_lambda=1.0)
    with pytest.raises(ValueError, match="temperature"):
        SurfaceFusionConfig(temperature=0)
    untied = tiny_t5()
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    with pytest.raises(ValueError, match="tied"):
        get_peft_model(untied, SurfaceFusionConfig())


def test_parameter_audit_counts_each_component():
    from peft_layerfusion.comparison.audit import trainable_components

    model = get_peft_model(tiny_bart(), SurfaceFusionConfig(learn_lambda=True))
    d, f = 16, 64
    assert trainable_components(model) == {
        "attention": 4 * (d * d + d),
        "ffn_up": d * f + f,
        "ffn_down": f * d + d,
        "lambda_gate": 2 * d + 1,
    }
