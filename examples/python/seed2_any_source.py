import torch
import torch.distributed as dist
import shmdist.torch
dist.init_process_group(backend='shm')
rank = dist.get_rank()
size = dist.get_world_size()
if rank == 0:
    t = torch.tensor([1, 2, 3])
    dist.send(t, dst=2)
elif rank == 1:
    t = torch.tensor([4, 5, 6])
    dist.send(t, dst=2)
elif rank == 2:
    res = torch.zeros(3, dtype=torch.long)
    src_rank = dist.recv(res, src=dist.ANY_SOURCE)
    print(f"Received from {src_rank}: {res}")
dist.destroy_process_group()
