"""Tokenization: draftgen's reconstruction + tokenization of answers (`Format.rebuild_batch`,
qwen3 format, the real Qwen3 tokenizer) against raw `tokenizers` `encode_batch` of the same
native texts, in one run.

The answers are N fake Qwen3 answers of a realistic size (150-300 reasoning tokens, 100-200
content tokens, as the test server writes them) with `usage.completion_tokens` set, no
logprobs and no native IDs, so every one takes the reconstruction path: rebuild the native text
(`<think>\\n...\\n</think>\\n\\n...<|im_end|>`), encode it, check its length. Both sides run in
batches of the same size (128: the runner's OffLoopBatcher batch), alternately, REPEAT times;
the best pass of each is compared. The IDs of both sides are checked to be equal.

    /work/venv/bin/python bench/tokenization.py [--n 100000] [--batch 128] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()

    from tokenizers import Tokenizer as HFTokenizer

    from draftgen.formats import get_format
    from draftgen.testing.assets import qwen3_tokenizer_dir
    from draftgen.testing.fake_engine import fake_text
    from draftgen.tokenize import load_tokenizer
    from draftgen.types import RawAnswer, Usage

    common.print_machine()
    tokenizer = load_tokenizer(qwen3_tokenizer_dir())
    fmt = get_format("qwen3", tokenizer)
    raw_tok = HFTokenizer.from_file(str(qwen3_tokenizer_dir() / "tokenizer.json"))

    rng = random.Random(0)
    answers = [RawAnswer(reasoning=fake_text(rng, rng.randint(150, 300)),
                         content=fake_text(rng, rng.randint(100, 200)), finish_reason="stop")
               for _ in range(args.n)]
    texts = [fmt.answer_in_context(a, None).text for a in answers]
    b = args.batch
    def raw_pass(method: str) -> tuple[float, float, list[list[int]]]:
        encode = getattr(raw_tok, method)
        t, c = time.perf_counter(), _cpu()
        out = [e.ids for i in range(0, len(texts), b)
               for e in encode(texts[i : i + b], add_special_tokens=False)]
        return time.perf_counter() - t, _cpu() - c, out

    def draftgen_pass() -> tuple[float, float, list[list[int]]]:
        t, c = time.perf_counter(), _cpu()
        out = [r.output_ids for i in range(0, len(answers), b)
               for r in fmt.rebuild_batch(answers[i : i + b], [None] * len(answers[i : i + b]))]
        return time.perf_counter() - t, _cpu() - c, out

    baselines = ["encode_batch"]
    if hasattr(raw_tok, "encode_batch_fast"):
        baselines.append("encode_batch_fast")
    best: dict[str, tuple[float, float]] = {}
    _, _, reference = raw_pass("encode_batch")  # warm-up; gives the engine's token counts
    for a, ids in zip(answers, reference, strict=True):
        a.usage = Usage(completion_tokens=len(ids))
    tokens = sum(map(len, reference)) / args.n
    print(f"{args.n:,} answers, {tokens:.0f} tokens each on average, batches of {b}", flush=True)
    for _ in range(args.repeat):
        for name in [*baselines, "draftgen"]:
            wall, cpu, ids = draftgen_pass() if name == "draftgen" else raw_pass(name)
            if ids != reference:
                raise SystemExit(f"{name}: token IDs differ from encode_batch's")
            if name not in best or wall < best[name][0]:
                best[name] = (wall, cpu)
    base_wall = best["encode_batch"][0]
    for name, (wall, cpu) in best.items():
        label = "draftgen rebuild_batch" if name == "draftgen" else f"raw {name}"
        print(f"  {label:<26} {args.n / wall:9.0f} answers/s  {cpu / args.n * 1e6:7.1f} CPU µs"
              f"/answer   {base_wall / wall:.2f}× raw encode_batch", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
