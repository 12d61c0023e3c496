import torch, itertools, sys
sys.path.insert(0, "src")
from torch.profiler import profile, ProfilerActivity
from dfcil.models.network import build_network
from dfcil.models.batchnorm import BNMode
def count(bench, tf32, cl, shape_report=False):
    torch.backends.cudnn.benchmark = bench
    torch.backends.cudnn.allow_tf32 = tf32
    net = build_network("resnet32").cuda(); net.expand(40)
    fmt = torch.channels_last if cl else torch.contiguous_format
    net.to(memory_format=fmt)
    x = torch.randn(256, 3, 32, 32, device="cuda").contiguous(memory_format=fmt)
    def step():
        out = net(x, bn=BNMode(splits=2)); out.logits.sum().backward()
    for _ in range(3): step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU], record_shapes=shape_report) as p:
        for _ in range(2): step()
        torch.cuda.synchronize()
    ev = [e for e in p.events() if "convertTensor" in e.name]
    tot = sum(e.time_range.elapsed_us() for e in p.events() if e.device_type.name == "CUDA") / 2
    print(f"benchmark={bench} tf32={tf32} channels_last={cl}: convertTensor {len(ev)/2:.0f}/step, kernels {tot/1000:.2f} ms/step", flush=True)
    if shape_report:
        from collections import Counter
        c = Counter()
        for e in p.events():
            if e.name == "aten::cudnn_convolution" or e.name == "aten::convolution_backward":
                c[(e.name, str(e.input_shapes[:2]))] += 1
        for k, v in list(c.items())[:12]: print("  ", v/2, k)
for bench, tf32, cl in [(True, True, True), (True, True, False), (False, True, True), (True, False, True)]:
    count(bench, tf32, cl)
