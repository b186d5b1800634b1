import torch
import torch.distributed as dist
import shmdist.torch
dist.init_process_group(backend='shm')
rank = dist.get_rank()
if rank == 0:
    t = torch.tensor([10, 20, 30, 40])
    dist.send(t, dst=1)
elif rank == 1:
    res = torch.zeros(4, dtype=torch.long)
    src_rank = dist.recv(res, src=0)
    print(f"Received from {src_rank}: {res}")
dist.destroy_process_group()
