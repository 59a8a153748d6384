"""Session states that outlive a request: a snapshot file format (``snapshot_file``, over the
generic ``state_codec``) and a prompt cache by token prefix in memory and on disk
(``prompt_cache``)."""

from ds4mlx.engine.kvcache.prompt_cache import (
    MAX_CUT,
    Candidate,
    DiskTier,
    MemoryTier,
    PromptCache,
    common_prefix,
)
from ds4mlx.engine.kvcache.snapshot_file import (
    SnapshotFileError,
    model_fingerprint,
    read_snapshot,
    write_snapshot,
)
from ds4mlx.engine.kvcache.state_codec import StateFormatError

__all__ = [
    "MAX_CUT",
    "Candidate",
    "DiskTier",
    "MemoryTier",
    "PromptCache",
    "SnapshotFileError",
    "StateFormatError",
    "common_prefix",
    "model_fingerprint",
    "read_snapshot",
    "write_snapshot",
]
