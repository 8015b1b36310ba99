"""gdskit for PyTorch Distributed Checkpoint: drop-in FileSystemWriter / FileSystemReader (gdskit/torch_dcp.py).

    dcp.save(state_dict, storage_writer=gdskit.torch.FileSystemWriter(path))
"""
from ..torch_dcp import SUFFIX, FileSystemReader, FileSystemWriter, last_stats  # noqa: F401
