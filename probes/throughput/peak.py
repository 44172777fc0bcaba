"""The device's peak FLOP/s by its name and the matmuls' precision: the denominator of MFU.

Dense tensor-core figures (without the 2:4 sparsity NVIDIA's headline figures double them
by), in TFLOP/s, from NVIDIA's datasheets:

- A100: "NVIDIA A100 Tensor Core GPU" datasheet (SXM and PCIe alike): FP32 19.5,
  TF32 156, BF16/FP16 312.
- H100 SXM, PCIe, NVL: "NVIDIA H100 Tensor Core GPU" datasheet: FP32 67 / 51 / 60,
  TF32 494.5 / 378 / 417.5, BF16/FP16 989.5 / 756 / 835.5 (each half its "with sparsity").
- H200 SXM, NVL: "NVIDIA H200 Tensor Core GPU" datasheet: as the H100 SXM and NVL.
- L4: "NVIDIA L4 Tensor Core GPU" datasheet: FP32 30.3, TF32 60, BF16/FP16 121.
- L40S: "NVIDIA L40S" datasheet: FP32 91.6, TF32 183, BF16/FP16 362.
- A10: "NVIDIA A10 Tensor Core GPU" datasheet: FP32 31.2, TF32 62.5, BF16/FP16 125.
- V100 SXM2, PCIe: "NVIDIA V100" datasheet: FP32 15.7 / 14, FP16 125 / 112 (no BF16 or
  TF32: an FP32 matmul runs at the FP32 peak).
- T4: "NVIDIA T4" datasheet: FP32 8.1, FP16 65.

torchtitan's ``get_peak_flops`` uses the same BF16 figures (A100 312, H100 SXM/H200 989,
H100 PCIe 756, H100 NVL 835, L40S 362).
"""

from __future__ import annotations

TERA = 1e12
# (name fragments that must all be in the device's name, {dtype: dense TFLOP/s}); the
# more specific first: "H100 NVL" before "H100", "L40S" before "L4", "A100" before "A10"
PEAKS: tuple[tuple[tuple[str, ...], dict[str, float]], ...] = (
    (("H200", "NVL"), {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (("H200",), {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0}),
    (("H100", "NVL"), {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (("H100", "PCIE"), {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    (("H100",), {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0}),
    (("A100",), {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (("L40S",), {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    (("L4",), {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (("A10",), {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (("V100", "PCIE"), {"fp16": 112.0, "fp32": 14.0}),
    (("V100",), {"fp16": 125.0, "fp32": 15.7}),
    (("T4",), {"fp16": 65.0, "fp32": 8.1}),
)


def peak_flops(device: str, dtype: str) -> tuple[float | None, str | None]:
    """The dense peak FLOP/s of ``device`` (as ``torch.cuda.get_device_name`` says it) for
    matmuls in ``dtype`` (bf16, fp16, tf32, fp32), or None and why. The name's words are
    matched whole: "L4" is not "L40S", "A10" is not "A100" or "A10G"."""
    words = set(device.upper().replace("-", " ").replace("_", " ").split())
    for fragments, table in PEAKS:
        if words.issuperset(fragments):
            if dtype == "tf32" and dtype not in table:  # no TF32 cores: FP32's peak
                dtype = "fp32"
            if dtype not in table:
                return None, f"{device} has no {dtype} peak in bsmon's table"
            return table[dtype] * TERA, None
    return None, f"no peak FLOP/s for {device} in bsmon's table"
