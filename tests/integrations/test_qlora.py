"""QLoRA: a bitsandbytes 4-bit (and 8-bit) base prepared with ``prepare_model_for_kbit_training``,
fusion + LoRA in one adapter. The fusion module stays float32, training moves it and LoRA (the
quantised base does not move), the adapter saves and reloads bitwise onto a fresh quantised base,
and the logits equal an independent recomputation from the quantised model's own stream
(``output_hidden_states``, ``z_L`` from the last block, then ``F`` and the head).

Runs wherever bitsandbytes quantises: its CPU backend (0.50 here does 4-bit NF4 and 8-bit), or a GPU.
"""

from __future__ import annotations

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is missing: pip install -e '.[integrations]'")

from peft import PeftModel, get_peft_model, prepare_model_for_kbit_training  # noqa: E402
from tiny_llms import LORA_TARGETS, adapter_parameters, moved, tiny_llm  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

from peft_layerfusion import DWAttConfig, ScalarMixConfig  # noqa: E402
from peft_layerfusion.layer import fusion_layer_of  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = 80
# Every quantised projection's input a multiple of 64 and its output of 32: on a CPU with AVX512-BF16,
# bitsandbytes repacks 4-bit weights in blocks of 64 x 32 for an inference forward and refuses others
WIDTH = 64
QUANTISATION = {
    4: dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32),
    8: dict(load_in_8bit=True),
}


def quantises(bits: int) -> str | None:
    """Why bitsandbytes cannot quantise ``bits``-bit weights on ``DEVICE`` here (``None`` if it can)."""
    weight = torch.randn(64, 64)
    try:
        if bits == 4:
            bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4").to(DEVICE)
        else:
            bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False).to(DEVICE)
    except Exception as error:  # noqa: BLE001  (any backend failure means: not here)
        return f"bitsandbytes {bnb.__version__} cannot quantise {bits}-bit on {DEVICE}: {error}"
    return None


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("llama")
    tiny_llm("llama", "causal", VOCAB, width=WIDTH).save_pretrained(folder)
    return str(folder)


def quantised(folder: str, bits: int) -> torch.nn.Module:
    config = BitsAndBytesConfig(**QUANTISATION[bits])
    # float32 outside the quantised layers on both stacks (transformers 4.57 would load float16)
    return AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=config, device_map=DEVICE, dtype=torch.float32
    )


def batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, VOCAB, (4, 10), generator=generator)
    ids[:, 1::2] = (ids[:, 0::2] * 7) % (VOCAB - 4) + 4  # every second token follows from the one before
    return {key: value.to(DEVICE) for key, value in
            {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}.items()}  # fmt: skip


def recomputed_logits(model: PeftModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``lm_head(F(γ Σ softmax(w)_n z_n))`` from the model's own ``output_hidden_states`` (LoRA active),
    ``z_L`` from a forward hook on the last block: the library's fusion code is not used."""
    llama = model.get_base_model()
    module = fusion_layer_of(model).fusion_modules["default"]
    seen = []
    handle = llama.model.layers[-1].register_forward_hook(
        lambda m, args, out: seen.append(out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        states = llama(**inputs, output_hidden_states=True).hidden_states
    handle.remove()
    stream = [*states[1:-1], seen[-1]]  # z_1 .. z_L, as the quantised model computes them
    weights = torch.softmax(module.layer_logits.detach(), 0) * module.gamma.detach()
    fused = sum(w * z for w, z in zip(weights, stream, strict=True))
    with torch.no_grad():
        return llama.lm_head(llama.model.norm(fused))


@pytest.mark.parametrize(
    "bits, config_cls",
    [(4, ScalarMixConfig), (8, ScalarMixConfig), (4, DWAttConfig)],
    ids=["4bit-scalar_mix", "8bit-scalar_mix", "4bit-dwatt"],
)
def test_quantised_base_with_fusion_and_lora_trains_reloads_and_matches_recomputation(
    base_folder, tmp_path, bits, config_cls
):
    reason = quantises(bits)
    if reason:
        pytest.skip(reason)
    base = prepare_model_for_kbit_training(quantised(base_folder, bits), use_gradient_checkpointing=True)
    quantised_weight = base.model.layers[0].self_attn.q_proj.weight.detach().clone()
    torch.manual_seed(0)
    options = {"fusion_init": "paper"} if config_cls is ScalarMixConfig else {}
    model = get_peft_model(base, config_cls(target_modules=LORA_TARGETS["llama"], r=4, **options))
    module = fusion_layer_of(model).fusion_modules["default"]
    assert {p.dtype for p in module.parameters()} == {torch.float32}  # its own dtype, not the base's
    assert base.model.layers[0].self_attn.q_proj.base_layer.weight.dtype in (torch.uint8, torch.int8)

    before = adapter_parameters(model)
    inputs = batch()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    model.train()
    losses = []
    for _ in range(8):
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses
    assert moved(before, model, "_fusion.") and moved(before, model, "lora_")
    assert torch.equal(base.model.layers[0].self_attn.q_proj.base_layer.weight, quantised_weight)
    assert {p.dtype for p in module.parameters()} == {torch.float32}

    model.eval()
    logits_inputs = {k: v for k, v in inputs.items() if k != "labels"}
    with torch.no_grad():
        trained = model(**logits_inputs).logits
    if config_cls is ScalarMixConfig:
        torch.testing.assert_close(trained, recomputed_logits(model, logits_inputs), rtol=1e-5, atol=1e-5)
    model.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(quantised(base_folder, bits), tmp_path / "adapter").eval()
    with torch.no_grad():
        assert torch.equal(reloaded(**logits_inputs).logits, trained)


def test_sft_trainer_on_a_4bit_base_casts_fusion_and_lora_to_bf16_and_trains(base_folder, tmp_path):
    """TRL casts every trainable parameter of a quantised model to bf16 (``param.data = ...``), the
    fusion module's included, but not its buffers (DWAtt's depth embeddings: cast where read). The
    adapter saves those bf16 values; peft reloads them as float32 (``autocast_adapter_dtype``), so
    the reload equals the trained model once its adapter parameters are cast back to bf16."""
    trl = pytest.importorskip("trl", reason="TRL is missing: pip install -e '.[integrations]'")
    reason = quantises(4)
    if reason:
        pytest.skip(reason)
    from datasets import Dataset
    from tiny_llms import SENTENCES, tokenizer_folder
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder(tmp_path / "tokenizer"))
    arguments = trl.SFTConfig(
        str(tmp_path / "run"), max_steps=6, per_device_train_batch_size=4, learning_rate=1e-2, bf16=False,
        save_strategy="no", logging_strategy="no", report_to=[], use_cpu=DEVICE == "cpu", disable_tqdm=True,
        seed=0, max_length=32,
    )  # fmt: skip
    data = Dataset.from_dict({"text": [SENTENCES[i % len(SENTENCES)] for i in range(32)]})
    config = DWAttConfig(task_type="CAUSAL_LM", target_modules=LORA_TARGETS["llama"], r=4)
    trainer = trl.SFTTrainer(model=quantised(base_folder, 4), args=arguments, train_dataset=data,
                             processing_class=tokenizer, peft_config=config)  # fmt: skip
    module = fusion_layer_of(trainer.model).fusion_modules["default"]
    assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    assert module.depth_embeddings.dtype == torch.float32
    before = adapter_parameters(trainer.model)
    trainer.train()
    assert moved(before, trainer.model, "_fusion.") and moved(before, trainer.model, "lora_")
    trainer.save_model(str(tmp_path / "adapter"))
    inputs = tokenizer(list(SENTENCES), return_tensors="pt", padding=True).to(DEVICE)
    reloaded = PeftModel.from_pretrained(quantised(base_folder, 4), tmp_path / "adapter").eval()
    for name, parameter in reloaded.named_parameters():
        if "lora_" in name or "_fusion." in name:
            parameter.data = parameter.data.to(torch.bfloat16)  # as TRL cast them for training
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).logits, trainer.model.eval()(**inputs).logits)
