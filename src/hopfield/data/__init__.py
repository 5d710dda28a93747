"""Dataset loaders. Each takes a data directory (argument or ``$HOPFIELD_DATA``) and verifies checksums."""

from hopfield.data.files import (
    DATA_ENV,
    ChecksumError,
    DataFile,
    DataNotFoundError,
    data_root,
    locate,
)

__all__ = ["DATA_ENV", "ChecksumError", "DataFile", "DataNotFoundError", "data_root", "locate"]
