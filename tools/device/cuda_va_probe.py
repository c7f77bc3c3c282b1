# cudaMalloc's address for a sequence of sizes (MiB), straight through libcudart: how the CUDA driver lays
# segments out (docs/accuracy.md, "The step as autograd runs it"). On the device: python3 tools/device/cuda_va_probe.py
import ctypes, glob, os, sys
import torch
torch.cuda.init()
libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cuda_runtime", "lib", "libcudart.so*")) + glob.glob("/usr/local/cuda/lib64/libcudart.so*")
rt = ctypes.CDLL(libs[0])
def alloc(mib):
    p = ctypes.c_void_p()
    rc = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(int(mib * 2**20)))
    assert rc == 0, rc
    return p.value
def free(p): rt.cudaFree(ctypes.c_void_p(p))
seqs = {
 "ascending": [2, 4, 8, 12, 16, 18, 20, 22, 24, 28, 32, 34, 40, 48, 54, 64, 70, 96, 100, 128, 200, 1002],
 "mixed": [20, 2, 2, 24, 12, 20, 2, 70, 70, 2, 12, 32, 20, 26, 2, 1188, 892, 2, 12, 54, 54, 20, 2],
}
for name, seq in seqs.items():
    ptrs = []
    base = None
    for mib in seq:
        p = alloc(mib); ptrs.append(p)
        base = base or p
        print(name, "%6.1f MiB at %#x  end %#x  rel %+.1f MiB  align32 %s" % (mib, p, p + int(mib * 2**20), (p - base) / 2**20, p % (32 << 20) == 0))
    # free two in the middle, allocate again
    free(ptrs[3]); free(ptrs[5])
    for mib in (2, 12, 20):
        p = alloc(mib); print(name, "after frees %5.1f MiB at %#x rel %+.1f MiB" % (mib, p, (p - base) / 2**20))
    sys.stdout.flush()
