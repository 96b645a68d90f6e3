"""scripts/gpu/summarize.py on a GPU run's files: the targets (cuda_flash's FP32 share,
cuda_flash_bf16's share of the bf16 tensor-core peak, cuda_decode's share of the measured read
bandwidth) decided from kernel_times.csv as `attnlab cuda --time` writes it, and the tables."""
import csv
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUMMARIZE = os.path.join(ROOT, "scripts", "gpu", "summarize.py")
FIELDS = ["kernel", "batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal", "dtype", "kv_dtype",
          "kv_block", "flops", "kernel_ms", "launches", "tflops", "fp32_peak_tflops", "fp32_fraction",
          "bf16_tensor_peak_tflops", "tensor_fraction", "bytes", "gbytes_per_s", "read_gbs", "read_fraction",
          "verified"]


def point(kernel, q_len, kv_len, causal=0, dtype="f32", kv_dtype="dtype", kv_block=0, heads=(16, 16), tflops=0.0,
          fp32=0.0, tensor=0.0, gbs=0.0, read=0.0, verified="PASS"):
    return {"kernel": kernel, "batch": 2 if q_len > 1 else 1, "q_heads": heads[0], "kv_heads": heads[1],
            "q_len": q_len, "kv_len": kv_len, "head_dim": 128, "causal": causal, "dtype": dtype,
            "kv_dtype": kv_dtype, "kv_block": kv_block, "flops": 1e12, "kernel_ms": 1.0, "launches": 10,
            "tflops": tflops, "fp32_peak_tflops": 66.9, "fp32_fraction": fp32, "bf16_tensor_peak_tflops": 1070,
            "tensor_fraction": tensor, "bytes": 1e9, "gbytes_per_s": gbs, "read_gbs": 4000, "read_fraction": read,
            "verified": verified}


def summarize(tmp_path, points, torch_rows=()):
    out = tmp_path / "out"
    out.mkdir()
    if torch_rows:
        with open(out / "torch.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(torch_rows[0]))
            w.writeheader()
            w.writerows(torch_rows)
    with open(out / "kernel_times.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(points)
    (out / "device.txt").write_text("CUDA: NVIDIA H100 (sm_90, 132 SMs)\nhost: test\n")
    (out / "log.txt").write_text("[run.sh +1s] step tensor-nomask: ok (20 s)\n")
    r = subprocess.run([sys.executable, SUMMARIZE, str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return (out / "summary.md").read_text()


def test_targets_are_decided_by_the_units_own_peak(tmp_path):
    md = summarize(tmp_path, [
        point("cuda_flash", 4096, 4096, causal=1, tflops=20, fp32=0.30),
        point("cuda_flash_bf16", 16384, 16384, dtype="bf16", tflops=480, tensor=0.45, fp32=7.2),
        point("cuda_flash_bf16", 16384, 16384, dtype="bf16", heads=(16, 4), tflops=300, tensor=0.28),
        point("cuda_decode", 1, 32768, causal=1, dtype="bf16", gbs=3300, read=0.825),
        point("cuda_decode", 1, 131072, causal=1, kv_dtype="q8_0", kv_block=16, gbs=2000, read=0.5),
        point("cuda_decode", 1, 4096, causal=1, dtype="bf16", gbs=4400, read=1.1),
    ])
    assert "target >= 35%: NOT met" in md  # cuda_flash at 30% of the FP32 peak
    assert "= 45.0% of the dense bf16 tensor-core peak; target >= 40%: met" in md  # MHA, not the GQA row
    assert "best: bf16 at 32768 keys, 3300 GB/s = 82% of the read bandwidth; 1 of 2 cache points" in md
    assert "| bf16 | 1000 us, 4400 GB/s (110%) | 1000 us, 3300 GB/s (82%) | - |" in md
    assert "| q8_0 paged/16 | - | - | 1000 us, 2000 GB/s (50%) |" in md
    # The prefill table: cuda_flash_bf16's cells are % of the tensor peak, the others' % of FP32.
    assert "| cuda_flash_bf16 | bf16 | no | 16/16 | 128 |" in md and "480.0 (45%)" in md
    assert "| cuda_flash | f32 | yes | 16/16 | 128 | 20.0 (30%) |" in md
    assert "Device memory read bandwidth, measured on the device" in md and "**4000 GB/s**" in md


def test_a_run_without_times_says_so(tmp_path):
    md = summarize(tmp_path, [])
    assert "cuda_flash_bf16: no kernel time at this shape" in md
    assert "cuda_decode: no kernel time at 32k+" in md
    assert "FlashInfer's decode reads paged KV at 88-89%" in md  # the anchors stand in for a peer


@pytest.mark.parametrize("verdict", ["FAIL"])
def test_a_failed_verification_shows_in_the_cell(tmp_path, verdict):
    md = summarize(tmp_path, [point("cuda_decode", 1, 32768, dtype="f16", gbs=3000, read=0.75, verified=verdict)])
    assert f"3000 GB/s (75%) {verdict}" in md


def test_torch_rows_stand_beside_the_lab_kernel_of_their_precision(tmp_path):
    shape = {"device": "cuda", "batch": 2, "q_heads": 16, "kv_heads": 16, "seq": 4096, "head_dim": 128, "causal": 0}
    md = summarize(tmp_path, [point("cuda_flash", 4096, 4096, tflops=22, fp32=0.33),
                              point("cuda_flash_bf16", 4096, 4096, dtype="bf16", tflops=400, tensor=0.37)],
                   [dict(shape, impl="torch_sdpa_f32", ms="0.5", tflops="44", backend="cutlass", verdict="agrees"),
                    dict(shape, impl="torch_sdpa_bf16", ms="0.25", tflops="530", backend="cudnn", verdict="agrees"),
                    dict(shape, impl="torch_sdpa_bf16", seq=16384, ms="3.0", tflops="540", backend="cudnn",
                         verdict="agrees")])
    assert "| cuda_flash 1.000 (0.50x) |" in md  # torch's f32 call beside cuda_flash (kernel_ms 1.0)
    assert "| cuda_flash_bf16 1.000 (0.25x) |" in md  # its bf16 call beside the tensor-core kernel
    long = next(line for line in md.splitlines() if line.startswith("| torch_sdpa_bf16 |") and "| 16384 |" in line)
    assert long.endswith("| agrees | - |")  # no lab time at 16384 in this run
