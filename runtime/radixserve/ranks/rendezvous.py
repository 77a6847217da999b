"""The file a tensor-parallel group meets at (torch.distributed's `file://` init method), in a
private temporary directory that the group's leader removes when the group ends or fails to form."""
from __future__ import annotations

import os
import shutil
import tempfile


def new_rendezvous() -> str:
    return "file://" + os.path.join(tempfile.mkdtemp(prefix="radixserve-tp-"), "rendezvous")


def remove_rendezvous(init_method: str) -> None:
    shutil.rmtree(os.path.dirname(init_method.removeprefix("file://")), ignore_errors=True)
