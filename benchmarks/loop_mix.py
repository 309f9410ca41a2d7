"""The machine instructions of rows.c's vector loops, by kind: what one pass over 8 float32 values costs.

    .venv/bin/python benchmarks/loop_mix.py                                  # nn_channels_eval, transform_row
    .venv/bin/python benchmarks/loop_mix.py --function backward_row

Why: rows.c's kernels are bound by arithmetic, not memory (docs/performance.md, issue 40), so the instructions
per vector iteration bound their speed on a given CPU. This compiles rows.c as rows.py does (its FLAGS, with
-fopenmp, for this machine: -march=native), disassembles it with objdump, and for each loop of a function that
uses 256-bit (ymm) registers, the innermost ones (a backward jump whose body holds no other such loop), prints
the instruction count and the mix: multiply-adds, other arithmetic, selects (compare and blend), integer and
conversion work (splitting a float into exponent and mantissa, building 2^k), constants reloaded from memory
(broadcasts: AVX2 has 16 vector registers), loads/stores and loop control. Needs gcc (or `CC`) and objdump.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from normkit_normalnorm import rows

KINDS = [  # (kind, mnemonic pattern), first match wins
    ("multiply-add", r"^vf(n)?m(add|sub)"),
    ("mul/add/sub/div/sqrt", r"^v(mul|add|sub|div|sqrt|min|max)[ps]s$"),
    ("select (compare, blend)", r"^v(cmp\w*|blendv?)ps$"),
    ("integer, conversion, rounding", r"^(vp\w+|vcvt\w+|vround\w+)$"),
    ("bit ops (abs, sign)", r"^v(and|andn|or|xor)ps$"),
    ("constant reloads (broadcast)", r"^vbroadcast"),
    ("loads/stores, register moves", r"^vmov"),
]
OTHER = "loop control, other"
ORDER = [kind for kind, _ in KINDS] + [OTHER]
LINE = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")


def disassemble(function: str) -> list[tuple[int, str, str]]:
    """(address, mnemonic, operands) of `function` and of the OpenMP bodies GCC outlined from it."""
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "rows.so"
        compiler = rows._compiler()  # CC, or the first C compiler found, as rows.py builds with
        if compiler is None:
            raise SystemExit("no C compiler: set CC")
        subprocess.run([*compiler, *rows.FLAGS, "-fopenmp", str(rows.SOURCE), "-o", str(target)], check=True)
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(target)], capture_output=True, text=True,
                              check=True).stdout
    out, inside = [], False
    for line in text.splitlines():
        header = re.match(r"^[0-9a-f]+ <([^>]+)>:$", line)
        if header:
            inside = header.group(1).split(".")[0] == function
            continue
        match = LINE.match(line) if inside else None
        if match:
            out.append((int(match.group(1), 16), match.group(2), match.group(3)))
    return out


def vector_loops(code: list[tuple[int, str, str]]) -> list[list[tuple[int, str, str]]]:
    """The innermost loops (backward jumps) that use ymm registers, each as its instructions in address order."""
    loops = []
    for address, mnemonic, operands in code:
        target = re.match(r"([0-9a-f]+)", operands) if mnemonic.startswith("j") else None
        if target and int(target.group(1), 16) < address:
            body = [ins for ins in code if int(target.group(1), 16) <= ins[0] <= address]
            if any("ymm" in ins[2] for ins in body):
                loops.append(body)
    return [loop for loop in loops
            if not any(other is not loop and loop[0][0] <= other[0][0] and other[-1][0] <= loop[-1][0]
                       and len(other) < len(loop) for other in loops)]


def mix(loop: list[tuple[int, str, str]]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for _, mnemonic, _ in loop:
        kind = next((name for name, pattern in KINDS if re.match(pattern, mnemonic)), OTHER)
        counts[kind] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--function", action="append",
                        help="rows.c function (repeatable; default nn_channels_eval and transform_row)")
    args = parser.parse_args()
    for function in args.function or ["nn_channels_eval", "transform_row"]:
        seen: Counter[tuple[tuple[str, int], ...]] = Counter()  # GCC inlines or clones a function into its callers
        for loop in vector_loops(disassemble(function)):
            seen[tuple(sorted(mix(loop).items()))] += 1
        for number, (counts, copies) in enumerate(seen.items(), 1):
            total = sum(count for _, count in counts)
            print(f"{function}, vector loop {number}: {total} instructions per iteration "
                  f"({copies} cop{'y' if copies == 1 else 'ies'} in the library)")
            for kind, count in sorted(counts, key=lambda item: ORDER.index(item[0])):
                print(f"    {count:3d}  {kind}")


if __name__ == "__main__":
    main()
