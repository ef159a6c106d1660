import json
import os

from torch.utils.data import DataLoader

# from dataflux_pytorch import dataflux_iterable_dataset
from torchbucket.dataflux import dataflux_iterable_dataset

PROJECT_NAME = os.environ["PROJECT_NAME"]
BUCKET_NAME = os.environ["BUCKET_NAME"]
PREFIX = os.environ["PREFIX"]

transform = lambda data_in_bytes: data_in_bytes.decode()  # noqa: E731

# Positional Config: sort_listing_results, max_composite_object_size,
# num_processes, prefix, max_listing_retries, disable_compose: compose off.
iterable_dataset = dataflux_iterable_dataset.DataFluxIterableDataset(
    PROJECT_NAME,
    BUCKET_NAME,
    dataflux_iterable_dataset.Config(False, 100000000, 4, PREFIX, 3, True),
    transform,
)

single = [each_object for each_object in iterable_dataset]

loader = DataLoader(iterable_dataset, batch_size=4, num_workers=2)
workers = [sample for batch in loader for sample in batch]

print(
    "RESULT "
    + json.dumps(
        {
            "objects": iterable_dataset.objects,
            "single": single,
            "workers": workers,
            "max_composite_object_size": iterable_dataset.config.max_composite_object_size,
        }
    )
)
