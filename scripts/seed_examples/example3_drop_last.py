import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

class SimpleDataset(Dataset):
	def __init__(self):
		self.data = list(range(23))
	
	def __len__(self):
		return len(self.data)
	
	def __getitem__(self, idx):
		return self.data[idx]

dataset = SimpleDataset()

# Создаем два процесса (для примера устанавливаем вручную)
sampler_rank0 = DistributedSampler(
	dataset,
	num_replicas=2,
	rank=0,
	drop_last=True
)

sampler_rank1 = DistributedSampler(
	dataset,
	num_replicas=2,
	rank=1,
	drop_last=True
)

dataloader0 = DataLoader(dataset, batch_size=4, sampler=sampler_rank0)
dataloader1 = DataLoader(dataset, batch_size=4, sampler=sampler_rank1)

print("Rank 0 samples:")
for batch in dataloader0:
	print(batch)

print("\nRank 1 samples:")
for batch in dataloader1:
	print(batch)
