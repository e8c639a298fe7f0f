"""TRL's SFTTrainer and RewardTrainer with a fusion config as ``peft_config`` (tiny Llama and GPT-2).

Each run trains (the loss goes down, the fusion and LoRA weights move, the base's do not), saves
the adapter and reloads it bitwise; under TRL's own preparation: gradient checkpointing (reentrant
or not, with ``enable_input_require_grads``), packing (padding-free, ``position_ids``), and its
mixed-precision default (``bf16=True``), whose autocast stays wrapped around the trained model's
``forward`` (docs/guides/integrations.md says which output to trust).
"""

from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[integrations]'")

from accelerate.utils import extract_model_from_parallel  # noqa: E402
from conftest import TOKEN_WISE_CONFIGS  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import PeftModel  # noqa: E402
from tiny_llms import (  # noqa: E402
    FAMILIES,
    LORA_TARGETS,
    SENTENCES,
    adapter_parameters,
    assert_base_frozen,
    frozen_state,
    moved,
    tiny_llm,
    tokenizer_folder,
)
from transformers import AutoTokenizer  # noqa: E402

from peft_layerfusion import DWAttConfig, ScalarMixConfig  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(tokenizer_folder(tmp_path_factory.mktemp("tokenizer")))


def quiet(config_cls, output_dir, **overrides):
    """A TRL config for a few CPU steps, batch 4, seed 0: no checkpoint, log or report, fp32 unless told."""
    values = dict(
        max_steps=8, per_device_train_batch_size=4, learning_rate=1e-2, save_strategy="no",
        logging_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0, bf16=False,
        gradient_checkpointing=False,
    )  # fmt: skip
    return config_cls(str(output_dir), **{**values, **overrides})


def text_batch(tokenizer) -> dict[str, torch.Tensor]:
    batch = tokenizer(list(SENTENCES), return_tensors="pt", padding=True)
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return batch


def lm_loss(model, batch) -> float:
    with torch.no_grad():
        return model.eval()(**batch).loss.item()


def sft_run(tokenizer, tmp_path, family="llama", config=None, **arguments):
    """Train a fresh tiny ``family`` LM with SFTTrainer and ``config``; return (trainer, base before,
    adapter parameters before, loss before)."""
    model = tiny_llm(family, "causal", len(tokenizer))
    before = frozen_state(model)
    config = config or DWAttConfig(task_type="CAUSAL_LM", target_modules=LORA_TARGETS[family], r=4)
    data = Dataset.from_dict({"text": [SENTENCES[i % len(SENTENCES)] for i in range(32)]})
    trainer = trl.SFTTrainer(
        model=model, args=quiet(trl.SFTConfig, tmp_path / "run", max_length=32, **arguments),
        train_dataset=data, processing_class=tokenizer, peft_config=config,
    )  # fmt: skip
    batch = text_batch(tokenizer)
    return trainer, before, adapter_parameters(trainer.model), lm_loss(trainer.model, batch)


def check_trained_and_reloaded(trainer, tokenizer, tmp_path, family, before, adapter_before, loss_before,
                               head="causal", fusion_moves=True):  # fmt: skip
    """The loss went down, fusion (and LoRA) moved, the base did not; the saved adapter reloads bitwise."""
    model = trainer.model
    batch = text_batch(tokenizer)
    if head == "causal":
        loss_after = lm_loss(model, batch)
        assert loss_after < loss_before - 0.05, (loss_before, loss_after)
    assert not fusion_moves or moved(adapter_before, model, "_fusion.")
    if any("lora_" in name for name in adapter_before):
        assert moved(adapter_before, model, "lora_")
    assert_base_frozen(model, before)
    trainer.save_model(str(tmp_path / "adapter"))
    num_labels = 1 if head == "seq" else 2
    fresh = tiny_llm(family, head, len(tokenizer), num_labels=num_labels)
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    trained = extract_model_from_parallel(model, keep_fp32_wrapper=False).eval()
    for (name, a), (_, b) in zip(trained.state_dict().items(), reloaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask")}
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).logits, trained(**inputs).logits)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "checkpointing",
    [None, {"use_reentrant": True}, {"use_reentrant": False}],
    ids=["no-gc", "reentrant", "non-reentrant"],
)
def test_sft_trainer_trains_dwatt_with_lora_and_reloads_bitwise(tokenizer, tmp_path, family, checkpointing):
    trainer, before, adapter_before, loss_before = sft_run(
        tokenizer, tmp_path, family,
        gradient_checkpointing=checkpointing is not None, gradient_checkpointing_kwargs=checkpointing,
    )  # fmt: skip
    trainer.train()
    assert trainer.model.get_base_model().is_gradient_checkpointing == (checkpointing is not None)
    if checkpointing is not None:  # the blocks ran under torch's checkpoint with the mode asked for
        block = next(m for m in trainer.model.modules() if hasattr(m, "_gradient_checkpointing_func"))
        assert block._gradient_checkpointing_func.keywords["use_reentrant"] == checkpointing["use_reentrant"]
    check_trained_and_reloaded(trainer, tokenizer, tmp_path, family, before, adapter_before, loss_before)


@pytest.mark.parametrize("family", FAMILIES)
def test_sft_trainer_with_packing_trains_and_reloads_bitwise(tokenizer, tmp_path, family):
    trainer, before, adapter_before, loss_before = sft_run(tokenizer, tmp_path, family, packing=True)
    batch = next(iter(trainer.get_train_dataloader()))
    assert "position_ids" in batch and batch["input_ids"].shape[0] == 1  # padding-free: one packed row
    trainer.train()
    check_trained_and_reloaded(trainer, tokenizer, tmp_path, family, before, adapter_before, loss_before)


@pytest.mark.parametrize("config_cls", TOKEN_WISE_CONFIGS, ids=lambda c: c.__name__)
def test_sft_trainer_trains_every_token_wise_method(tokenizer, tmp_path, config_cls):
    config = config_cls(task_type="CAUSAL_LM", target_modules=LORA_TARGETS["llama"], r=4)
    trainer, before, adapter_before, loss_before = sft_run(tokenizer, tmp_path, config=config, max_steps=6)
    trainer.train()
    has_weights = any("_fusion." in name for name in adapter_before)  # Average has none
    check_trained_and_reloaded(
        trainer, tokenizer, tmp_path, "llama", before, adapter_before, loss_before, fusion_moves=has_weights
    )


def test_sft_trainer_mixed_precision_default_leaves_autocast_on_the_trained_model(tokenizer, tmp_path):
    """TRL's default ``bf16=True``: accelerate wraps the model's ``forward`` in bf16 autocast for
    training, and the wrapper stays after ``train()``. The adapter's weights stay float32: the reload
    (float32 compute) equals the unwrapped trained model bitwise; the still-wrapped one differs."""
    trainer, *_ = sft_run(tokenizer, tmp_path, bf16=True, max_steps=4)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters() if p.requires_grad)
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    fresh = tiny_llm("llama", "causal", len(tokenizer))
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    inputs = {k: v for k, v in text_batch(tokenizer).items() if k != "labels"}
    with torch.no_grad():
        wrapped = trainer.model.eval()(**inputs).logits
        unwrapped = extract_model_from_parallel(trainer.model, keep_fp32_wrapper=False)(**inputs).logits
        expected = reloaded(**inputs).logits
    assert torch.equal(unwrapped, expected)
    difference = (wrapped - expected).abs().max().item()
    print(f"bf16-autocast forward vs reload: max |diff| = {difference:.2e}")
    assert 0 < difference < 0.05


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("config_cls", [DWAttConfig, ScalarMixConfig], ids=lambda c: c.__name__)
def test_reward_trainer_trains_sequence_classifier_with_fusion_and_reloads_bitwise(
    tokenizer, tmp_path, family, config_cls
):
    model = tiny_llm(family, "seq", len(tokenizer), num_labels=1)
    before = frozen_state(model)
    preferred = [(SENTENCES[i % 4], SENTENCES[(i + 1) % 4][::-1]) for i in range(32)]  # sense over reversed
    data = Dataset.from_dict({"chosen": [c for c, _ in preferred], "rejected": [r for _, r in preferred]})
    config = config_cls(task_type="SEQ_CLS", target_modules=LORA_TARGETS[family], r=4)
    trainer = trl.RewardTrainer(
        model=model, args=quiet(trl.RewardConfig, tmp_path / "run", max_length=48), train_dataset=data,
        processing_class=tokenizer, peft_config=config,
    )  # fmt: skip
    adapter_before = adapter_parameters(trainer.model)
    assert any("modules_to_save" in name and "score" in name for name in adapter_before)  # the head trains

    def margin() -> float:  # mean reward(chosen) - reward(rejected) over the pairs
        chosen = tokenizer([c for c, _ in preferred], return_tensors="pt", padding=True)
        rejected = tokenizer([r for _, r in preferred], return_tensors="pt", padding=True)
        with torch.no_grad():
            model_ = trainer.model.eval()
            return (model_(**chosen).logits - model_(**rejected).logits).mean().item()

    margin_before = margin()
    trainer.train()
    assert margin() > margin_before + 0.2  # GPT-2 on transformers 4.57: +0.27 in 8 steps
    check_trained_and_reloaded(trainer, tokenizer, tmp_path, family, before, adapter_before, None, head="seq")
