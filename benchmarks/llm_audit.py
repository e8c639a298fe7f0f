"""The parameter audit at LLM shapes: every method sized to the budget of one LoRA.

For each shape of ``peft_layerfusion.comparison.shapes.LLM_SHAPES`` (Gemma 3 270M, Qwen3-0.6B,
Llama-3.1-8B; built on the meta device, no weights) the script prints
:func:`~peft_layerfusion.comparison.audit.lora_sized_report`: the LoRA (rank 16 on ``q_proj,
k_proj, v_proj, o_proj`` by default), Concat at the ``map_rank`` and DWAtt at the bottleneck
width closest to it, R+n at one block (its least), Average and ScalarMix, and the three sized
methods at their paper defaults. Counts only: it runs in seconds.

Usage::

    python benchmarks/llm_audit.py [--shapes llama-3.1-8b ...] [--lora-r 16] [--targets q_proj v_proj]
"""

from __future__ import annotations

import argparse

from peft_layerfusion.comparison.audit import (
    ATTENTION_PROJECTIONS,
    LLM_LORA_R,
    format_table,
    lora_sized_report,
)
from peft_layerfusion.comparison.shapes import LLM_SHAPES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(LLM_SHAPES), choices=list(LLM_SHAPES))
    parser.add_argument(
        "--lora-r", type=int, default=LLM_LORA_R, help="rank of the LoRA that sets the budget"
    )
    parser.add_argument(
        "--targets", nargs="+", default=list(ATTENTION_PROJECTIONS), help="its target_modules"
    )
    args = parser.parse_args(argv)
    for shape in args.shapes:
        report = lora_sized_report(shape, args.lora_r, args.targets)
        print(
            f"\n## {shape}: budget {report['target']:,} (LoRA r={args.lora_r} on {', '.join(args.targets)})\n"
        )
        print(format_table(report["rows"], reference="lora"))
        for first, second, gap in report["flagged"]:
            print(f"FLAG: {first} and {second} differ by {gap:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
