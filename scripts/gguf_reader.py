"""gguf-py's GGUFReader, parsing its header from a plain numpy view of the
file rather than the np.memmap it maps: every slice of a memmap runs
memmap's Python-level __array_finalize__, and a 262k-token vocabulary
is millions of slices (Gemma 3's header: 15 s, against 4.6 s here). The
values, tensors and offsets are gguf-py's own: only the view type differs."""

import gguf
import numpy as np


class Reader(gguf.GGUFReader):
    def _get(self, offset, dtype, count=1, override_order=None):
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        count = int(count)
        end = offset + np.dtype(dtype).itemsize * count
        arr = plain[offset:end].view(dtype=dtype)[:count]
        order = self.byte_order if override_order is None else override_order
        return arr.view(arr.dtype.newbyteorder(order))
