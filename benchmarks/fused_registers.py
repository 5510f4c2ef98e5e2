"""The fused kernel compiled for an H100 or H200 (sm_90) on this machine, no GPU needed: the
registers and the spill stack of each kernel program's threads, per form × tile rows × warps.

    pip install triton        # the compiler alone (about 300 MB); no GPU needed
    python benchmarks/fused_registers.py [--heads M] [--dim D] [--tokens T]
    pip install -e ".[gpu-compile]"    # JAX's CUDA plugin and ptxas
    JAX_PLATFORMS=cpu python benchmarks/fused_registers.py --compiler xla

``--compiler triton`` (the default): JAX lowers ``mhalearn.fused.fused_loss_and_grad`` to
Triton's IR for CUDA, as ``jax.export`` does for a GPU; the Triton package compiles that IR to
machine code for sm_90, and its ``cuobjdump`` reads the registers per thread and the stack.
Its Triton is not the one that XLA carries. ``--compiler xla``: the installed jaxlib's XLA
compiles the kernel, vmapped over instances as a GPU runs it, for a compile-only H100 (as
``gpu_programs.py`` does), through its own Triton, down to PTX; ``ptxas`` (CUDA's, of the
``gpu-compile`` extra) assembles that PTX for sm_90a and reports the registers and the stack:
what a GPU would run with this jaxlib. A program that spills keeps values in local memory,
which is slow, and the registers per thread bound how many programs an SM runs at once
(65 536 registers per SM, at most 255 per thread). These figures guide the kernel's defaults
(``TILE_ROWS``, ``WARPS``, ``RECOMPUTE``); which variant is faster is for a GPU to say
(``fused.py``, a step of ``gpu_check.sh``). Rows go to benchmarks/results/fused_registers.csv.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import export

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import STANDARD, append_rows, machine, table

from mhalearn import fused
from mhalearn.platforms import lowering_for_gpu

#: registers of one streaming multiprocessor (sm_90)
SM_REGISTERS = 65536


def _kernel(form: str, tile_rows: int, recompute: bool, **more):
    """The fused kernel of one variant, compiled for a GPU (not interpreted)."""
    return functools.partial(
        fused.fused_loss_and_grad,
        form=form,
        tile_rows=tile_rows,
        recompute=recompute,
        interpret=False,
        **more,
    )


def triton_ir(shape: dict, form: str, tile_rows: int, recompute: bool) -> str:
    """The kernel's Triton IR for CUDA at ``shape``, as text (read where JAX's Pallas lowering
    makes it: a private function, so this script follows JAX's versions)."""
    from jax._src.pallas.triton import pallas_call_registration as registration

    seen: list[str] = []
    lower = registration.lowering.lower_jaxpr_to_triton_module

    def keep(*args, **kwargs):
        result = lower(*args, **kwargs)
        seen.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    n, T, d, m = shape["samples"], shape["tokens"], shape["dim"], shape["heads"]
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in [(n, T, d)] * 2 + [(m, d, d)] * 2]
    fn = _kernel(form, tile_rows, recompute)
    registration.lowering.lower_jaxpr_to_triton_module = keep
    try:
        with lowering_for_gpu():  # an H100's sm_90, the target below, whatever GPU is here
            export.export(
                jax.jit(fn),
                platforms=["cuda"],
                disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
            )(*args)
    finally:
        registration.lowering.lower_jaxpr_to_triton_module = lower
    (text,) = seen
    return text


def resources(ir: str, warps: int) -> dict:
    """Registers per thread, stack bytes per thread and shared bytes of the IR compiled for
    sm_90 with ``warps`` warps."""
    import triton
    from triton.backends.compiler import GPUTarget

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = Path(tmp) / "kernel.ttir"
        path.write_text(ir)
        kernel = triton.compile(
            str(path), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}
        )
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        usage = subprocess.run(
            [str(tool), "--dump-resource-usage", str(cubin)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"cuobjdump printed no resource usage: {usage}")
    registers, stack, shared = map(int, found.groups())
    return dict(
        registers=registers,
        stack_bytes=stack,
        shared_bytes=shared,
        programs_per_sm=SM_REGISTERS // (registers * 32 * warps),
    )


def ptxas() -> str:
    """CUDA's PTX assembler: on the PATH, or of the nvidia-cuda-nvcc wheel."""
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        from nvidia import cuda_nvcc
    except ImportError:
        sys.exit('needs ptxas: pip install -e ".[gpu-compile]"')
    return str(Path(next(iter(cuda_nvcc.__path__))) / "bin" / "ptxas")


def xla_resources(shape: dict, form: str, tile_rows: int, recompute: bool, warps: int) -> dict:
    """Registers and stack bytes per thread, and shared bytes, of the kernel as the installed
    jaxlib's XLA compiles it (8 instances, vmapped) for a compile-only H100: its Triton
    kernel's PTX, from XLA's dump, assembled by ptxas for sm_90a."""
    from gpu_programs import gpu_device

    n, T, d, m = shape["samples"], shape["tokens"], shape["dim"], shape["heads"]
    device = gpu_device()
    sharding = jax.sharding.SingleDeviceSharding(device)
    args = [
        jax.ShapeDtypeStruct((8, *s), jnp.float32, sharding=sharding)
        for s in [(n, T, d)] * 2 + [(m, d, d)] * 2
    ]
    fn = _kernel(form, tile_rows, recompute, warps=warps)
    with tempfile.TemporaryDirectory() as tmp, lowering_for_gpu(device.device_kind):
        options = {"xla_dump_to": tmp}
        if jax.__version_info__ >= (0, 11):  # its XLA dumps PTX among every emitter's steps
            options["xla_dump_emitter_re"] = ".*"
        jax.jit(jax.vmap(fn)).lower(*args).compile(options)
        kernels = [
            p for p in Path(tmp).glob("*.ptx") if re.search(r"\.entry kernel\(", p.read_text())
        ]
        if len(kernels) != 1:
            raise RuntimeError(f"expected one Triton kernel in XLA's dump, found {len(kernels)}")
        report = subprocess.run(
            [ptxas(), "-arch=sm_90a", "-v", str(kernels[0]), "-o", os.devnull],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        thunks = "".join(p.read_text() for p in Path(tmp).glob("*thunk_sequence.txt"))
    registers = re.search(r"Used (\d+) registers", report)
    stack = re.search(r"(\d+) bytes stack frame", report)
    shared = re.search(r" kernel grid: .*shared_memory: (\d+) bytes", thunks)
    if registers is None or stack is None:
        raise RuntimeError(f"ptxas reported no resource usage: {report}")
    registers = int(registers.group(1))
    return dict(
        registers=registers,
        stack_bytes=int(stack.group(1)),
        shared_bytes=int(shared.group(1)) if shared else -1,
        programs_per_sm=SM_REGISTERS // (registers * 32 * warps),
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for k, v in STANDARD.items():
        p.add_argument(f"--{k}", type=int, default=v)
    p.add_argument("--tile-rows", type=int, nargs="*", default=[16, 32])
    p.add_argument("--warps", type=int, nargs="*", default=[4, 8])
    p.add_argument(
        "--compiler",
        choices=["triton", "xla"],
        default="triton",
        help="the Triton package, or the installed jaxlib's XLA and its own Triton",
    )
    args = p.parse_args()
    if args.compiler == "triton":
        try:
            import triton
        except ImportError:
            sys.exit("needs the Triton compiler: pip install triton")
        os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
        compiler = f"Triton {triton.__version__}"
    else:
        compiler = f"jaxlib {jax.__version__}'s XLA"
    shape = {k: getattr(args, k) for k in STANDARD}
    rows = []
    for form, recompute, tile_rows in itertools.product(fused.FORMS, (False, True), args.tile_rows):
        ir = triton_ir(shape, form, tile_rows, recompute) if args.compiler == "triton" else None
        for warps in args.warps:
            if ir is None:
                used = xla_resources(shape, form, tile_rows, recompute, warps)
            else:
                used = resources(ir, warps)
            rows.append(
                dict(
                    **shape,
                    form=form,
                    recompute=recompute,
                    tile_rows=tile_rows,
                    warps=warps,
                    **used,
                    default=(tile_rows, warps) == (fused.TILE_ROWS, fused.WARPS),
                    compiler=compiler,
                    jax=jax.__version__,
                )
            )
            print(rows[-1], flush=True)
    print(f"\n{shape}, compiled for sm_90 by {compiler}:")
    cols = [
        "form",
        "recompute",
        "tile_rows",
        "warps",
        "registers",
        "stack_bytes",
        "programs_per_sm",
    ]
    print(table(rows, [*cols, "default"]))
    append_rows("fused_registers", [{**machine(), **row} for row in rows])


if __name__ == "__main__":
    main()
