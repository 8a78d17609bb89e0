"""Reading UCMFH ``.pkl`` split files without running the code a pickle may carry.

A pickle can run arbitrary code when loaded. :class:`ArraysOnlyUnpickler` therefore reconstructs numpy
arrays, dtypes, scalars and plain containers only and refuses everything else (torch tensors, custom
classes, ``os.system``...). Pickles of protocol 0-2 store an array's bytes as ``_codecs.encode(str,
"latin1")``, which is allowed for the latin-1 codec only (it turns a str into bytes, nothing else); Python 2
pickles are read with ``encoding="latin1"``, numpy's documented setting for them.

Prefer ``.npz``: :func:`~patchword.hashing.readers.convert_pickle_to_npz` converts a trusted pickle once.
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

    def __init__(self, file: Any) -> None:
        super().__init__(file, encoding="latin1")  # Python 2 str of array bytes: numpy's documented setting

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):
            return _latin1_encode
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to unpickle {module}.{name}: only numpy arrays and plain containers are loaded from "
            "pickles (convert the file to .npz with numpy arrays)"
        )


_LATIN1 = {"latin1", "latin-1", "latin_1", "iso-8859-1", "iso8859-1", "l1"}


def _latin1_encode(text: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """``_codecs.encode`` as protocol 0-2 pickles call it for bytes (``encode(str, "latin1")``), refusing
    every other codec (a pickle has no business compressing or transcoding data)."""
    if not isinstance(text, str) or not isinstance(encoding, str) or encoding.lower() not in _LATIN1:
        raise pickle.UnpicklingError(
            f"refusing to unpickle _codecs.encode with codec {encoding!r}: only latin-1 bytes are loaded"
        )
    return text.encode("latin1", errors="strict")


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
