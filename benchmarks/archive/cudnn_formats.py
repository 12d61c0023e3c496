"""cuDNN's memory-format conversions (``convertTensor`` kernels) in a ResNet-32 forward and backward, by setting.

    python benchmarks/archive/cudnn_formats.py        # on a CUDA machine

One student pass of R-DFCIL's RRL step (256 images, per-half BN) under the profiler, for channels_last or NCHW,
TF32 convolutions on or off, and ``cudnn.benchmark`` on or off: ``convertTensor`` launches and kernel milliseconds
per step. Our own tensors keep one format (tests/test_memory_format.py); what this counts is cuDNN's choice.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from dfcil.models.batchnorm import BNMode
from dfcil.models.network import build_network


def measure(benchmark: bool, tf32: bool, channels_last: bool, steps: int = 2) -> tuple[float, float]:
    torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = benchmark, tf32
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = build_network("resnet32").cuda()
    net.expand(40)
    net.to(memory_format=fmt)
    x = torch.randn(256, 3, 32, 32, device="cuda").contiguous(memory_format=fmt)

    def step() -> None:
        net(x, bn=BNMode(splits=2)).logits.sum().backward()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    converts = sum("convertTensor" in e.name for e in kernels) / steps
    return converts, sum(e.time_range.elapsed_us() for e in kernels) / steps / 1000


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 1
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| format | TF32 | cudnn.benchmark | convertTensor / step | kernel ms / step |\n|---|---|---|---:|---:|")
    for cl, tf32, bench in [(True, True, True), (True, True, False), (False, True, True), (True, False, True)]:
        converts, ms = measure(bench, tf32, cl)
        print(f"| {'channels_last' if cl else 'NCHW'} | {tf32} | {bench} | {converts:.0f} | {ms:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
