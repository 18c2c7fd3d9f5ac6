#!/usr/bin/env python3
"""Seconds per video for Wan 2.1 T2V 1.3B at its real size, with each attention backend.

For a lent GPU (run it as one prepared script; see ``benchmarks/README.md``). Nothing can be
downloaded there, so the checkpoint is built here with random weights in the real layout:
the transformer and VAE at the published 1.3B configs (``WanTransformer3DModel`` with 30
layers of 12 heads x 128, ``AutoencoderKLWan`` defaults), the UMT5 text encoder reduced to
one layer at the real width (4096) since only its output width matters for the DiT's cost.
It is saved with ``save_pretrained`` and loaded through omni's production path, then timed
per backend through ``Omni(dir, attention_backend=B).generate(...)``.

    python benchmarks/gpu_generate.py --out $OUT/gpu_generate.json           # on the GPU
    python benchmarks/gpu_generate.py --smoke                                 # here: tiny, CPU

Figures: load seconds, seconds per video (median of ``--rounds`` after a warm-up), peak
device memory, and the largest pixel difference against the first run (TORCH_SDPA); then the
same with each offload strategy (``--offloads``) on TORCH_SDPA: peak memory saved and the
slowdown, with pixels that must equal the run without offload. A backend that cannot
run here is reported with omni's reason, not skipped silently.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BACKENDS = ("TORCH_SDPA", "FLASH_ATTN", "CUDNN_ATTN", "FLASHINFER_ATTN", "SAGE_ATTN", "SAGE_ATTN_3", "CHUNKED_ATTN")


def build(directory: Path, smoke: bool) -> None:
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from omni_plugin_diffusion.tiny import tiny_t5_encoder, tiny_t5_tokenizer

    torch.manual_seed(0)
    if smoke:
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=16,
            in_channels=16,
            out_channels=16,
            text_dim=64,
            freq_dim=32,
            ffn_dim=64,
            num_layers=2,
            rope_max_seq_len=1024,
        )
        vae = AutoencoderKLWan(
            base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
        )
        text_dim = 64
    else:  # Wan2.1-T2V-1.3B transformer/config.json
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=12,
            attention_head_dim=128,
            in_channels=16,
            out_channels=16,
            text_dim=4096,
            freq_dim=256,
            ffn_dim=8960,
            num_layers=30,
            cross_attn_norm=True,
            eps=1e-6,
            rope_max_seq_len=1024,
        )
        vae = AutoencoderKLWan()
        text_dim = 4096
    encoder = tiny_t5_encoder(1, d_model=text_dim, umt5=True)
    pipe = WanPipeline(
        tokenizer=tiny_t5_tokenizer(model_max_length=64),
        text_encoder=encoder,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
    pipe.save_pretrained(str(directory), safe_serialization=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on this machine, to check the script runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--offloads", default="none,model_cpu,layerwise", help="strategies timed with TORCH_SDPA")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import numpy as np
    import torch

    from omni_core import Omni
    from omni_core.errors import OmniError
    from omni_core.platforms import current_platform

    platform = current_platform()
    width, height = (64, 32) if args.smoke else (832, 480)
    frames = 5 if args.smoke else args.frames
    steps = 2 if args.smoke else args.steps
    directory = Path(tempfile.mkdtemp(prefix="omni-gpu-gen-")) / "wan2.1-1.3b-random"
    started = time.perf_counter()
    build(directory, args.smoke)
    report: dict[str, Any] = {
        "model": "Wan2.1-T2V-1.3B layout, random weights" + (" (smoke: tiny)" if args.smoke else ""),
        "platform": platform.name,
        "device": platform.device_name(0) if platform.device_count() else "cpu",
        "size": f"{width}x{height}, {frames} frames, {steps} steps",
        "build_s": round(time.perf_counter() - started, 1),
        "backends": {},
    }
    reference = None
    dtype = "float32" if args.smoke else "bfloat16"
    runs = [("backends", b, {"attention_backend": b}) for b in args.backends.split(",") if b]
    runs += [
        ("offload", o, {"attention_backend": "TORCH_SDPA", **({} if o == "none" else {"offload": o})})
        for o in args.offloads.split(",")
        if o
    ]
    report["offload"] = {}
    for section, backend, options in runs:
        row: dict[str, Any] = {}
        try:
            t0 = time.perf_counter()
            with Omni(directory, dtype=dtype, progress=False, **options) as omni:
                row["load_s"] = round(time.perf_counter() - t0, 2)
                if torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()
                request = {"num_inference_steps": steps, "num_frames": frames, "width": width, "height": height}
                omni.generate("a red fox in snow", seed=0, **request)  # warm-up
                times, frames_out = [], None
                for _ in range(args.rounds):
                    t = time.perf_counter()
                    result = omni.generate("a red fox in snow", seed=0, **request)
                    platform.synchronize()
                    times.append(time.perf_counter() - t)
                    frames_out = result.videos[0].frames
                row["seconds_per_video"] = round(statistics.median(times), 3)
                row["attention"] = result.metadata.attention
                if torch.cuda.is_available():
                    row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                if reference is None:
                    reference = frames_out
                row["max_pixel_diff_vs_first"] = int(np.abs(frames_out.astype(int) - reference.astype(int)).max())
        except (OmniError, ValueError, RuntimeError) as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        report[section][backend] = row
        print(section, backend, row, flush=True)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
