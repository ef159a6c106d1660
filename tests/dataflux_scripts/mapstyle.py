import json
import os

import numpy
from torch.utils.data import DataLoader

# from dataflux_pytorch import dataflux_mapstyle_dataset
from torchbucket.dataflux import dataflux_mapstyle_dataset

PROJECT_NAME = os.environ["PROJECT_NAME"]
BUCKET_NAME = os.environ["BUCKET_NAME"]
PREFIX = os.environ["PREFIX"]

transform = lambda data_in_bytes: numpy.frombuffer(data_in_bytes, dtype=numpy.uint8)  # noqa: E731

map_dataset = dataflux_mapstyle_dataset.DataFluxMapStyleDataset(
    project_name=PROJECT_NAME,
    bucket_name=BUCKET_NAME,
    config=dataflux_mapstyle_dataset.Config(prefix=PREFIX),
    data_format_fn=transform,
)

# Random access to an object.
sample_object = map_dataset.objects[0]
name = sample_object[0]
size = sample_object[1]

# Positional Config: sort_listing_results, max_composite_object_size,
# num_processes, prefix, max_listing_retries, threads_per_process, disable_compose.
positional = dataflux_mapstyle_dataset.DataFluxMapStyleDataset(
    PROJECT_NAME,
    BUCKET_NAME,
    dataflux_mapstyle_dataset.Config(True, 0, 4, PREFIX, 3, 8, True),
    transform,
)

loader = DataLoader(map_dataset, batch_size=4, num_workers=2)
contents = [bytes(sample) for batch in loader for sample in batch]

# Train on a subset: dataflux users cut the listed objects.
map_dataset.objects = map_dataset.objects[:3]
subset = [bytes(map_dataset[i]) for i in range(len(map_dataset))]

empty = dataflux_mapstyle_dataset.DataFluxMapStyleDataset(
    project_name=PROJECT_NAME,
    bucket_name=BUCKET_NAME,
    config=dataflux_mapstyle_dataset.Config(prefix="no-such-prefix/"),
)

print(
    "RESULT "
    + json.dumps(
        {
            "first": [name, size],
            "objects": positional.objects,
            "contents": [c.decode() for c in contents],
            "subset": [c.decode() for c in subset],
            "empty": len(empty),
        }
    )
)
