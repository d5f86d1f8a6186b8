
import torch
MiB = 1 << 20
keep = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
torch.cuda.empty_cache()                      # releases nothing: no event without the mark
a = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda"); del a
torch.cuda.empty_cache()                      # releases the 30 MiB segment's cache
b = torch.empty(500 * MiB, dtype=torch.uint8, device="cuda")  # larger than anything held before
del b
for n in (40, 80, 160, 320):
    x = torch.empty(n * MiB, dtype=torch.uint8, device="cuda"); del x
    torch.cuda.empty_cache()
    y = torch.empty(2 * n * MiB, dtype=torch.uint8, device="cuda"); del y   # new, larger segment next
torch.cuda.empty_cache(); torch.cuda.empty_cache()   # the second releases nothing
