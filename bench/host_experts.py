"""Could the host compute a token's missed experts instead of moving them over the bus?

On a PCIe GPU a gathered miss moves an expert's bytes (2.65 MB at Qwen3-30B-A3B's 4-bit shape)
to the GPU; computing it on the host instead would move only a token's activations (4 KB). That
pays only if the host's quantized matmul reads experts near the bus's rate (44-55 GB/s measured
on the lent H100s and H200). This times MLX's CPU `gather_qmm` on one token and k experts of that
shape, per activation dtype, with the process's CPU time beside its wall time (threads used).

    python bench/host_experts.py [--experts 8] [--repeats 20] [--cores N] [--json]

`--cores N`: the experts cut across N streams, as streamer/cpu_cores.py cuts a call (1: one).
"""

import argparse
import json
import time

import mlx.core as mx

from streamer.cpu_cores import on_parts

HIDDEN, MOE_INTERMEDIATE, GROUP, BITS = 2048, 768, 64, 4  # Qwen3-30B-A3B's expert, 4-bit


def time_one(dtype: mx.Dtype, experts: int, repeats: int, cores: int = 1) -> dict:
    """GB/s of expert bytes one token's gather_qmm reads on the CPU, and CPU-time / wall."""
    with mx.stream(mx.cpu):
        weights = mx.random.normal((experts, 3 * MOE_INTERMEDIATE, HIDDEN)).astype(dtype)
        packed, scales, biases = mx.quantize(weights, group_size=GROUP, bits=BITS)
        x = mx.random.normal((1, 1, 1, HIDDEN)).astype(dtype)
        index = mx.arange(experts).reshape(1, experts)
        mx.eval(packed, scales, biases, x)

        def routed(a: int, b: int) -> mx.array:
            return mx.gather_qmm(
                x, packed, scales, biases, rhs_indices=index[:, a:b], group_size=GROUP, bits=BITS
            )

        def step() -> mx.array:
            return on_parts(routed, experts, cores, axis=1) if cores > 1 else routed(0, experts)

        mx.eval(step())  # warm
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(repeats):
            mx.eval(step())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    nbytes = (packed.nbytes + scales.nbytes + biases.nbytes) * repeats
    return {"dtype": str(dtype), "gb_per_s": nbytes / wall / 1e9, "threads": cpu / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [time_one(d, args.experts, args.repeats, args.cores) for d in (mx.bfloat16, mx.float32)]
    if args.json:
        print(json.dumps(rows))
        return
    for row in rows:
        rate, threads = row["gb_per_s"], row["threads"]
        print(f"{row['dtype']:>14}: {rate:.2f} GB/s, {threads:.2f} CPU s a wall s")


if __name__ == "__main__":
    main()
