"""`tapa bench {attention,model,cp,decode,generate,varlen,local}`: each benchmark module defines add_arguments and run."""

from __future__ import annotations

import importlib

BENCHMARKS = {
    "attention": ("tapa.bench.attention", "fused TAPA kernel vs SDPA flash/cuDNN: time, TFLOP/s, memory"),
    "model": ("tapa.bench.model", "training tokens/s and MFU, TAPA model vs RoPE model"),
    "cp": ("tapa.bench.cp", "context parallelism under torchrun: tokens/s and memory per GPU "
           "against CP 1 at the same row"),
    "decode": ("tapa.bench.decode", "split-KV decode step time vs SDPA"),
    "generate": ("tapa.bench.generate", "greedy decoding of whole models: ms per token, eager vs CUDA graphs"),
    "varlen": ("tapa.bench.varlen", "packed-document (varlen) TAPA kernel vs the dense kernel and "
               "FlexAttention's document mask"),
    "local": ("tapa.bench.local", "sliding-window attention layer (w=256, 1024) vs SDPA-flash causal"),
}


def add_arguments(parser):
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, (module_name, help_) in BENCHMARKS.items():
        sub_parser = sub.add_parser(name, help=help_, description=help_)
        sub_parser.set_defaults(_module=module_name)
        try:
            importlib.import_module(module_name).add_arguments(sub_parser)
        except ImportError as err:  # benchmark not built or its extra missing: say so when run
            sub_parser.set_defaults(_import_error=err)


def run(args):
    """Run the benchmark; a message it exits with (SystemExit("...")) becomes the command line's
    one `tapa bench NAME: error: ...` line, whether or not the benchmark named itself."""
    prog = f"tapa bench {args.benchmark}"
    try:
        if getattr(args, "_import_error", None) is not None:
            raise SystemExit(str(args._import_error))
        return importlib.import_module(args._module).run(args)
    except SystemExit as exit_:
        if not isinstance(exit_.code, str):
            raise
        message = exit_.code.removeprefix(prog).lstrip(": ")
        raise SystemExit(f"{prog}: error: {message}") from None
