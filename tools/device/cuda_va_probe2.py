# What else takes cudaMalloc's addresses, and when freed addresses come back: cudaMalloc, cudaFree and
# cudaHostAlloc straight through libcudart, in a fresh process, printing each address relative to
# the first (docs/accuracy.md, "The ties"). Follows tools/device/cuda_va_probe.py.
# On the device: python3 tools/device/cuda_va_probe2.py > $OUT/cuda_va_probe2.txt
import ctypes, glob, os
import torch

torch.cuda.init()
torch.zeros(1, device="cuda")
libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu*", "lib", "libcudart.so*")) + glob.glob(
    "/usr/local/cuda/lib64/libcudart.so*")
rt = ctypes.CDLL(libs[0])
M = 1 << 20
base = [None]


def dev(mib, what=""):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(int(mib * M))) == 0
    base[0] = base[0] or p.value
    print("  cudaMalloc    %5d MiB at %+9.1f MiB  32 MiB-aligned %d  %s" % (mib, (p.value - base[0]) / M, p.value % (32 * M) == 0, what))
    return p.value


def host(mib, what=""):
    p = ctypes.c_void_p()
    assert rt.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(int(mib * M)), 0) == 0
    print("  cudaHostAlloc %5d MiB at %+9.1f MiB  %s" % (mib, (p.value - base[0]) / M, what))
    return p.value


def free(p):
    assert rt.cudaFree(ctypes.c_void_p(p)) == 0


print("A: the first segments of a process, a freed one in the middle")
a = [dev(20) for _ in range(3)]
free(a[1])
dev(20, "after the middle 20 MiB was freed")
dev(2)
dev(12)
print("B: pinned host memory between device segments")
dev(20)
host(16, "pinned")
dev(16)
host(64, "pinned")
dev(16)
print("C: a first matmul (cuBLAS and its kernels loaded) between device segments")
dev(20)
t = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
(t @ t).sum().item()
dev(16, "after the matmul")
dev(16)
print("D: freed regions below, requests of their size and smaller")
fill = [dev(20) for _ in range(40)]
x = [dev(64, "region") for _ in range(4)]
free(x[1])
dev(64, "a 64 MiB request right after a 64 MiB segment was freed")
free(x[2])
dev(32, "32 MiB after another 64 MiB was freed")
dev(32, "32 MiB again")
y = [dev(96, "region") for _ in range(3)]
free(y[1])
dev(20, "20 MiB after a 96 MiB segment was freed")
dev(20, "20 MiB again")
dev(54, "54 MiB")
