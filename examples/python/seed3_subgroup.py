import torch
import torch.distributed as dist
import shmdist.torch
dist.init_process_group(backend='shm')
rank = dist.get_rank()
subgroup = dist.new_group(ranks=[0, 1])
if rank == 0:
    t = torch.tensor([7, 8, 9])
    dist.send(t, dst=1, group=subgroup)
elif rank == 1:
    res = torch.zeros(3)
    src_rank = dist.recv(res, src=0, group=subgroup)
    print(f"From {src_rank} in subgroup: {res}")
dist.destroy_process_group()
