import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

# Инициализация распределенной среды
dist.init_process_group(backend='nccl')
rank = dist.get_rank()
world_size = dist.get_world_size()

# Создаем простой датасет
class SimpleDataset(Dataset):
	def __init__(self):
		self.data = list(range(100))
	
	def __len__(self):
		return len(self.data)
	
	def __getitem__(self, idx):
		return self.data[idx]

dataset = SimpleDataset()

# Создаем DistributedSampler
sampler = DistributedSampler(
	dataset,
	num_replicas=world_size,
	rank=rank,
	shuffle=True,
	seed=42
)

# Создаем DataLoader
dataloader = DataLoader(
	dataset,
	batch_size=10,
	sampler=sampler
)

# Выводим данные из текущего процесса
for batch in dataloader:
	print(f"Rank {rank}, batch: {batch}")
	break
