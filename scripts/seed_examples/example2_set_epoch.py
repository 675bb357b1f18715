import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group(backend='nccl')
rank = dist.get_rank()

class SimpleDataset(Dataset):
	def __init__(self):
		self.data = list(range(50))
	
	def __len__(self):
		return len(self.data)
	
	def __getitem__(self, idx):
		return self.data[idx]

dataset = SimpleDataset()

sampler = DistributedSampler(
	dataset,
	shuffle=True,
	seed=123
)

dataloader = DataLoader(
	dataset,
	batch_size=5,
	sampler=sampler
)

# Обучение в течение 2 эпох
for epoch in range(2):
	sampler.set_epoch(epoch)  # Важно для перемешивания
	
	for batch in dataloader:
		print(f"Epoch {epoch}, Rank {rank}, batch: {batch}")
