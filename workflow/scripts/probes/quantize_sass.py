"""sm_90 SASS of `_quantize_kernel`, compiled without a GPU: registers and the instructions of each loop body.

Run from the repository root on any machine with Triton 3.6 (its bundled ptxas and cuobjdump; PYTHONPATH=$PWD):
    python workflow/scripts/probes/quantize_sass.py [KEY=VALUE ...]
KEY is one of the kernel's constexprs (BLOCK_M=8 BLOCK_K=256 SCALE_SRC=2 FAST=False SR=False RHT=False
EMIT_DQ=True PREFETCH=False ...) or num_warps=4. The arguments are specialized as a launch on a contiguous bf16
tensor specializes them (unit column stride, 16-divisible pointers, K and row stride). A loop body's count over the
BLOCK_M * BLOCK_K / (32 * num_warps) elements a thread holds is its instructions an element; registers set the blocks
an SM holds (65,536 / (registers * threads a block)). bench/NOTES.md rows 34-36 quote its output."""
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from minite_core.kernels import quantize as q

ARGS = {"x_ptr": "*bf16", "data_ptr": "*u8", "scale_ptr": "*u8", "sdec_ptr": "*fp32", "dq_ptr": "*bf16",
        "amax_ptr": "*fp32", "seed_ptr": "*i64", "index_ptr": "*i64", "M": "i32", "K": "i32", "stride_xm": "i32",
        "stride_xk": "constexpr", "seed": "i32", "row0": "constexpr", "col0": "constexpr"}
variant = {"BLOCK_M": 8, "BLOCK_K": 256, "TWO_D": False, "SCALE_SRC": 2, "FAST": False, "SR": False, "SEG_SEED": False,
           "RHT": False, "EMIT_DQ": True, "PREFETCH": False}
num_warps = 4
for arg in sys.argv[1:]:
    key, value = arg.split("=")
    if key == "num_warps":
        num_warps = int(value)
    elif key in variant:
        variant[key] = int(value) if value.lstrip("-").isdigit() else value == "True"
    else:
        sys.exit(f"quantize_sass: no constexpr {key!r}: one of {', '.join(variant)} or num_warps")
signature = {**ARGS, **dict.fromkeys(variant, "constexpr")}
div16 = [["tt.divisibility", 16]]
attrs = {(i,): div16 for i, name in enumerate(ARGS) if name.endswith("_ptr") or name in ("K", "stride_xm")}
src = ASTSource(fn=q._quantize_kernel, signature=signature, constexprs=dict(variant, stride_xk=1, row0=0, col0=0),
                attrs=attrs)
kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(kernel.asm["cubin"])
    f.flush()
    sass = subprocess.run([bin_dir / "cuobjdump", "-sass", f.name], capture_output=True, text=True, check=True).stdout
    usage = subprocess.run([bin_dir / "cuobjdump", "-res-usage", f.name], capture_output=True, text=True,
                           check=True).stdout
regs = int(re.search(r"REG:(\d+)", usage).group(1))
threads = 32 * num_warps
print(f"{variant} num_warps={num_warps}: {regs} registers, {65536 // (regs * threads)} blocks an SM by registers")
ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
per_thread = variant["BLOCK_M"] * variant["BLOCK_K"] // threads
for addr, text in ins:
    target = re.search(r"BRA (?:!?U?P\d, )?0x([0-9a-f]+)", text)
    if target and int(target.group(1), 16) < addr:  # a backward branch closes a loop
        body = [t for a, t in ins if int(target.group(1), 16) <= a <= addr]
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
        print(f"loop {int(target.group(1), 16):#x}-{addr:#x}: {len(body)} instructions "
              f"({len(body) / per_thread:.1f} an element); " + ", ".join(f"{k} {v}" for k, v in ops.most_common(10)))
