"""Reading UCMFH ``.pkl`` split files without running the code a pickle may carry.

A pickle can run arbitrary code when loaded. :class:`ArraysOnlyUnpickler` therefore reconstructs numpy
arrays, dtypes, scalars and plain containers only and refuses everything else (torch tensors, custom
classes, ``os.system``...). Prefer ``.npz``: :func:`~patchword.hashing.readers.convert_pickle_to_npz`
converts a trusted pickle once.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from patchword.errors import DataError
from patchword.readers import describe_content

__all__ = ["ArraysOnlyUnpickler", "read_array_pickle"]


class ArraysOnlyUnpickler(pickle.Unpickler):
    """Reconstructs numpy arrays, dtypes and scalars (and plain dict/list/tuple) only."""

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("collections", "OrderedDict"),
        *(
            (m, n)
            for m in ("numpy.core.multiarray", "numpy._core.multiarray")
            for n in ("_reconstruct", "scalar")
        ),
        *((m, "_frombuffer") for m in ("numpy.core.numeric", "numpy._core.numeric")),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to unpickle {module}.{name}: only numpy arrays and plain containers are loaded from "
            "pickles (convert the file to .npz with numpy arrays)"
        )


def read_array_pickle(path: Path) -> dict[str, Any]:
    """The top-level dict of arrays of a pickle file.

    Raises:
        DataError: the pickle holds anything but arrays and plain containers, or is not a dict.
    """
    try:
        data = ArraysOnlyUnpickler(io.BytesIO(path.read_bytes())).load()
    except pickle.UnpicklingError as err:  # a refused class, or a truncated pickle
        raise DataError(f"{path}: cannot read the pickle safely: {err}") from None
    except MemoryError:
        raise
    except Exception as err:  # text or damaged bytes make the opcodes fail with ValueError, KeyError...
        content = describe_content(path)
        if content != "binary data":  # empty, or text: the opcode's complaint would only confuse
            raise DataError(f"{path}: not a pickle ({content})") from None
        raise DataError(f"{path}: a damaged or truncated pickle: {err}") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a dict of arrays at the top level, got {type(data).__name__}")
    return data
