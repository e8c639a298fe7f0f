"""A SentenceTransformer whose transformer module carries a fusion adapter (tiny BERT encoder and tiny
Llama decoder): trained with sentence-transformers' own trainer and a standard loss, saved, reloaded
bitwise, its embeddings equal to a recomputation from ``output_hidden_states`` (pooling recomputed)."""

from __future__ import annotations

import pytest
import torch
import transformers

st = pytest.importorskip(
    "sentence_transformers", reason="sentence-transformers is not installed: pip install -e '.[integrations]'"
)

from conftest import write_tiny_decoder, write_tiny_model  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import PeftModel, get_peft_model  # noqa: E402
from sentence_transformers import (  # noqa: E402
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
    losses,
    models,
)
from tiny_llms import SENTENCES  # noqa: E402

from peft_layerfusion import ScalarMixConfig  # noqa: E402
from peft_layerfusion.layer import fusion_layer_of  # noqa: E402

WRITERS = {"bert": write_tiny_model, "llama": write_tiny_decoder}
TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5
FINAL_NORM = {"bert": None, "llama": "norm"}  # the decoder's final norm F (applied after the fusion)


def sentence_model(path: str) -> SentenceTransformer:
    """Transformer module on the tiny model at ``path`` + mean pooling (no download)."""
    transformer = models.Transformer(path, max_seq_length=32)
    pooling = models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="mean")
    return SentenceTransformer(modules=[transformer, pooling], device="cpu")


def with_fusion(model: SentenceTransformer) -> SentenceTransformer:
    """``model`` whose transformer module carries a ScalarMix adapter (weights drawn away from uniform)."""
    torch.manual_seed(0)
    # `model[0].model` is what sentence-transformers (5.x) runs and saves (`auto_model` is a read-only alias)
    model[0].model = get_peft_model(model[0].model, ScalarMixConfig(fusion_init="paper"))
    return model


def recomputed_embeddings(path: str, family: str, mix: dict[str, torch.Tensor], texts) -> torch.Tensor:
    """Mean-pooled ``F(γ Σ softmax(w)_n z_n)`` from a fresh base's ``output_hidden_states`` (``z_L``
    before the final norm ``F`` from a pre-hook on it), independent of the library."""
    base = sentence_model(path)
    features = base.tokenize(list(texts))
    backbone = base[0].auto_model.eval()
    seen = []
    norm = backbone.get_submodule(FINAL_NORM[family]) if FINAL_NORM[family] else None
    handle = norm.register_forward_pre_hook(lambda m, args: seen.append(args[0])) if norm else None
    with torch.no_grad():
        inputs = {key: features[key] for key in ("input_ids", "attention_mask")}
        states = backbone(**inputs, output_hidden_states=True).hidden_states
        states = [*states[:-1], seen[-1]] if norm else list(states)
        if handle:
            handle.remove()
        weights = torch.softmax(mix["layer_logits"], dim=0) * mix["gamma"]
        fused = sum(w * z for w, z in zip(weights, states[1:], strict=True))  # (batch, seq, d)
        fused = norm(fused) if norm else fused
        mask = features["attention_mask"].unsqueeze(-1).to(fused.dtype)  # (batch, seq, 1)
        return (fused * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


@pytest.mark.parametrize("family", list(WRITERS))
def test_sentence_transformer_with_fusion_trains_saves_reloads_and_matches_recomputation(tmp_path, family):
    path = WRITERS[family](tmp_path / "base")
    model = with_fusion(sentence_model(path))
    module = fusion_layer_of(model[0].auto_model).fusion_modules["default"]
    mix_before = {name: p.detach().clone() for name, p in module.named_parameters()}
    backbone = model[0].auto_model
    frozen_before = {n: p.detach().clone() for n, p in backbone.named_parameters() if not p.requires_grad}
    pairs = Dataset.from_dict({"anchor": list(SENTENCES) * 4, "positive": [s.upper() for s in SENTENCES] * 4})

    loss = losses.MultipleNegativesRankingLoss(model)
    arguments = SentenceTransformerTrainingArguments(
        str(tmp_path / "run"), max_steps=6, per_device_train_batch_size=4, learning_rate=5e-2,
        save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
    )  # fmt: skip
    SentenceTransformerTrainer(model=model, args=arguments, train_dataset=pairs, loss=loss).train()

    mix = {name: p.detach().clone() for name, p in module.named_parameters()}
    assert any(not torch.equal(mix[name], mix_before[name]) for name in mix)  # the fusion trained
    for name, p in model[0].auto_model.named_parameters():
        if name in frozen_before:
            assert torch.equal(p, frozen_before[name]), name  # the base did not
    model.eval()
    embeddings = model.encode(list(SENTENCES), convert_to_tensor=True)
    assert torch.allclose(embeddings, recomputed_embeddings(path, family, mix, SENTENCES), atol=1e-5)

    model.save(str(tmp_path / "saved"))
    assert (tmp_path / "saved" / "adapter_model.safetensors").exists()  # the adapter, not the base
    # the base, then the adapter through peft: bitwise
    reloaded = sentence_model(path)
    reloaded[0].model = PeftModel.from_pretrained(reloaded[0].model, tmp_path / "saved")
    assert torch.equal(reloaded.encode(list(SENTENCES), convert_to_tensor=True), embeddings)
    # sentence-transformers' own load goes through transformers' `load_adapter` (the adapter's hooks on
    # the bare model, which sentence-transformers calls as `model.forward(...)`): equal up to float
    # rounding (transformers 5 leaves the loaded tensors unaligned, tests/library/test_load_adapter.py).
    # transformers 4 reads no adapter-only folder there (no config.json): nothing to check
    if not TRANSFORMERS_5:
        return
    loaded = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert not isinstance(loaded[0].model, PeftModel)
    torch.testing.assert_close(loaded.encode(list(SENTENCES), convert_to_tensor=True), embeddings)
