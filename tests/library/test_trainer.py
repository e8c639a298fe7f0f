"""transformers' Trainer on a fusion adapter: trains the fusion and the head, saves, reloads bitwise."""

from __future__ import annotations

import copy

import torch
from conftest import TINY, tiny_bert
from peft import PeftModel, get_peft_model
from transformers import Trainer, TrainingArguments

from peft_layerfusion import DWAttConfig
from peft_layerfusion.layer import fusion_layer_of

NUM_LABELS = 5


def token_examples(count: int = 16, length: int = 8) -> list[dict[str, torch.Tensor]]:
    """Random token sequences whose tag is a function of the token (learnable), one padded tail each."""
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(count):
        input_ids = torch.randint(1, TINY["vocab_size"], (length,), generator=generator)
        attention_mask = torch.ones(length, dtype=torch.long)
        labels = input_ids % NUM_LABELS
        attention_mask[-2:] = 0
        labels[-2:] = -100  # padding is not scored
        examples.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})
    return examples


def quiet_arguments(output_dir: str, max_steps: int, learning_rate: float) -> TrainingArguments:
    """Trainer arguments for a few steps on the CPU, batch 4, seed 0: no checkpoint, log or report."""
    return TrainingArguments(
        output_dir, max_steps=max_steps, per_device_train_batch_size=4, learning_rate=learning_rate,
        save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
    )  # fmt: skip


def mean_loss(model: torch.nn.Module, examples: list[dict[str, torch.Tensor]]) -> float:
    batch = {key: torch.stack([example[key] for example in examples]) for key in examples[0]}
    with torch.no_grad():
        return model.eval()(**batch).loss.item()


def test_trainer_trains_fusion_and_head_from_task_type_alone_then_reloads_bitwise(tmp_path):
    base = tiny_bert(num_labels=NUM_LABELS)
    encoder_before = copy.deepcopy(base.bert.state_dict())
    head_before = base.classifier.weight.detach().clone()
    model = get_peft_model(base, DWAttConfig(task_type="TOKEN_CLS"))  # no modules_to_save given
    fusion_before = copy.deepcopy(fusion_layer_of(model).fusion_modules["default"].state_dict())
    examples = token_examples()
    loss_before = mean_loss(model, examples)

    arguments = quiet_arguments(str(tmp_path / "run"), max_steps=8, learning_rate=1e-2)
    trainer = Trainer(model=model, args=arguments, train_dataset=examples)
    trainer.train()

    loss_after = mean_loss(model, examples)
    print(f"loss {loss_before:.4f} -> {loss_after:.4f}")
    assert loss_after < loss_before - 0.05
    head = model.base_model.model.classifier
    assert not torch.equal(head.modules_to_save["default"].weight, head_before)  # the head trained
    assert torch.equal(head.original_module.weight, head_before)
    fusion_after = fusion_layer_of(model).fusion_modules["default"].state_dict()
    assert any(not torch.equal(fusion_after[name], tensor) for name, tensor in fusion_before.items())
    for name, tensor in model.base_model.model.bert.state_dict().items():
        if name in encoder_before:  # the encoder's own weights stayed frozen
            assert torch.equal(tensor, encoder_before[name]), name

    trainer.save_model(str(tmp_path / "adapter"))  # the adapter only, through PeftModel.save_pretrained
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    assert "import peft_layerfusion" in (tmp_path / "adapter" / "README.md").read_text()
    reloaded = PeftModel.from_pretrained(tiny_bert(num_labels=NUM_LABELS), tmp_path / "adapter").eval()
    batch = {key: torch.stack([example[key] for example in examples]) for key in examples[0]}
    with torch.no_grad():
        assert torch.equal(reloaded(**batch).logits, model.eval()(**batch).logits)
