"""KV storage of the continuous engine: ``RowKV`` (ragged rows in one buffer) and ``PrefixCache`` (reusable KV).

``RowKV`` is a transformers ``Cache`` holding rows of different lengths left-aligned in one preallocated buffer
``[layers, 2, rows, kv_heads, capacity, head_dim]``: a row joins or leaves by copying only its own KV, each
step writes every row's new tokens at that row's own length, and a 4-D mask lets each query see exactly its
row's tokens, so a row computes what it would compute alone. ``PrefixCache`` keeps finished rows' KV keyed by
their token ids (LRU under a byte bound) so a prompt that extends them prefills only its new tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

_GROW_TOKENS = 256  # capacity grows in steps of at least this many positions


class _RowLayer(CacheLayerMixin):
    """One model layer's view of a ``RowKV``: writes this step's keys/values, returns the attended window."""

    def __init__(self, owner: RowKV, index: int) -> None:
        super().__init__()
        self.owner, self.index = owner, index
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.owner._write(self.index, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner._view_len, 0

    def get_seq_length(self) -> int:
        return self.owner._view_len

    def get_max_length(self) -> int:
        return -1


class RowKV(Cache):
    """Rows of different lengths in one buffer; call ``plan`` before each forward and ``advance`` after it.

    ``owners[i]`` is whatever the engine keeps for row ``i``; removing a row moves the last row into its place.
    """

    def __init__(
        self, num_layers: int, *, float_mask_dtype: torch.dtype | None = None, max_rows: int = 1 << 30
    ) -> None:
        """``float_mask_dtype``: build additive float masks (eager attention) instead of boolean ones (SDPA);
        ``max_rows``: the most rows the buffer's geometric growth allocates room for (more still fit on demand)."""
        super().__init__(layers=[_RowLayer(self, i) for i in range(num_layers)])
        self.num_layers = num_layers
        self.max_rows = max_rows
        self.float_mask_dtype = float_mask_dtype
        self.buffer: torch.Tensor | None = None
        self.lengths: list[int] = []
        self.owners: list[Any] = []
        self._cols: torch.Tensor | None = None
        self._row_index: torch.Tensor | None = None
        self._view_len = 0
        self._need_len = 0

    @property
    def rows(self) -> int:
        """Rows held (``len()`` stays transformers' layer count)."""
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.numel() * self.buffer.element_size()

    # -- rows ------------------------------------------------------------------------------------
    def add_row(self, owner: Any, kv: torch.Tensor | None = None) -> int:
        """Append a row holding ``kv`` (``[layers, 2, kv_heads, n, head_dim]``, copied) or nothing yet."""
        row = len(self.lengths)
        n = 0 if kv is None else kv.shape[3]
        self.lengths.append(n)
        self.owners.append(owner)
        if kv is not None and n:
            self._ensure(kv, rows=row + 1, length=n)
            assert self.buffer is not None
            self.buffer[:, :, row, :, :n].copy_(kv)
        return row

    def remove_rows(self, rows: set[int], scrub: set[int] | frozenset[int] = frozenset()) -> None:
        """Drop ``rows``; each is refilled by the current last row (a copy of that one row only).

        ``scrub``: rows whose whole slot is zeroed first (a failed row may hold NaN/inf, and a masked column
        still multiplies its value by 0, so a later row in that slot would turn NaN).
        """
        if self.buffer is not None:
            for row in scrub:
                self.buffer[:, :, row].zero_()
        for row in sorted(rows, reverse=True):
            last = len(self.lengths) - 1
            if row != last:
                n = self.lengths[last]
                if self.buffer is not None and n:
                    self.buffer[:, :, row, :, :n].copy_(self.buffer[:, :, last, :, :n])
                self.lengths[row], self.owners[row] = self.lengths[last], self.owners[last]
            self.lengths.pop()
            self.owners.pop()
        # An emptied buffer is kept for the next rows (re-zeroing it each turn cost more than the forwards'
        # attention); the engine releases it once idle for a while.

    def clear(self) -> None:
        """Drop every row and free the buffer (a weight change or an engine failure: nothing is worth keeping)."""
        self.remove_rows(set(range(len(self.lengths))))
        self.buffer = None

    def write_row(self, row: int, kv: torch.Tensor) -> None:
        """Copy ``kv`` (``[layers, 2, kv_heads, n, head_dim]``) into row ``row``'s first n columns, as a forward
        would write them: the row's length moves only with ``advance``."""
        n = kv.shape[3]
        self._ensure(kv, rows=len(self.lengths), length=n)
        assert self.buffer is not None
        self.buffer[:, :, row, :, :n].copy_(kv)

    def zero_tail(self, row: int) -> None:
        """Zero row ``row``'s columns past its length (KV written there by queries it did not keep)."""
        if self.buffer is not None:
            self.buffer[:, :, row, :, self.lengths[row] :].zero_()

    def row_kv(self, row: int) -> torch.Tensor:
        """Row ``row``'s KV as a view ``[layers, 2, kv_heads, length, head_dim]`` (clone it to keep it)."""
        n = self.lengths[row]
        assert self.buffer is not None or n == 0
        if self.buffer is None:
            raise ValueError("row has no KV yet")
        return self.buffer[:, :, row, :, :n]

    # -- one forward -----------------------------------------------------------------------------
    def plan(self, queries: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Prepare a forward where row i feeds ``queries[i]`` new tokens, right-aligned in a window of
        ``max(queries)`` columns (so every row's last token is the window's last column).

        Returns the 4-D attention mask ``[rows, 1, window, attended]`` and the position ids ``[rows, window]``.
        Padding queries write their KV past the row's end (overwritten later, never attended) and attend
        only column 0, which keeps them finite.
        """
        window = max(queries)
        lengths = torch.tensor(self.lengths, dtype=torch.long)
        q = torch.tensor(queries, dtype=torch.long)
        j = torch.arange(window, dtype=torch.long)[None, :]
        pad = window - q[:, None]  # leading padding columns of each row
        valid = j >= pad
        cols = torch.where(valid, lengths[:, None] + j - pad, lengths[:, None] + q[:, None] + j)
        self._view_len = int((lengths + q).max())
        self._need_len = int(lengths.max()) + window
        self._cols = cols.to(device)
        self._row_index = torch.arange(len(self.lengths), device=device)[:, None]
        attended = torch.arange(self._view_len, dtype=torch.long)[None, None, :]
        mask = torch.where(valid[:, :, None], attended <= cols[:, :, None], attended == 0)[:, None]
        positions = torch.where(valid, cols, 0)
        mask = mask.to(device)
        if self.float_mask_dtype is not None:
            zeros = torch.zeros(mask.shape, dtype=self.float_mask_dtype, device=device)
            mask = zeros.masked_fill(~mask, torch.finfo(self.float_mask_dtype).min)
        return mask, positions.to(device)

    def advance(self, queries: list[int]) -> None:
        """Commit a forward planned with ``queries``: each row now holds that many more tokens."""
        self.lengths = [n + q for n, q in zip(self.lengths, queries, strict=True)]

    def release(self) -> None:
        """Free the buffer of an empty ``RowKV`` (the engine calls it after a while idle)."""
        if not self.lengths:
            self.buffer = None

    def _ensure(self, like: torch.Tensor, *, rows: int, length: int) -> None:
        """Grow the buffer (keeping its contents) to hold ``rows`` rows of ``length`` positions."""
        kv_heads, head_dim = like.shape[-3], like.shape[-1]
        cap_rows = cap_len = 0
        if self.buffer is not None:
            cap_rows, cap_len = self.buffer.shape[2], self.buffer.shape[4]
            if rows <= cap_rows and length <= cap_len:
                return
        # Geometric growth with slack (rows double, positions grow 1.5x plus a margin), so rows that join one
        # by one and decode token by token cost amortised O(1) copies; ``max_rows`` caps the row growth.
        new_rows = cap_rows if rows <= cap_rows else max(rows, min(max(2 * cap_rows, 4), self.max_rows))
        new_len = cap_len if length <= cap_len else max(length + _GROW_TOKENS // 2, _GROW_TOKENS, cap_len * 3 // 2)
        grown = torch.empty(
            (self.num_layers, 2, new_rows, kv_heads, new_len, head_dim), dtype=like.dtype, device=like.device
        )
        # Only the new memory is zeroed (never left ``empty``: a masked column still multiplies its value by 0,
        # and 0 * NaN is NaN); the old part is copied. Stale KV of rows that left stays: it is finite and masked.
        if self.buffer is not None:
            grown[:, :, :cap_rows, :, :cap_len].copy_(self.buffer)
            grown[:, :, :cap_rows, :, cap_len:].zero_()
            grown[:, :, cap_rows:].zero_()
        else:
            grown.zero_()
        self.buffer = grown

    def _write(
        self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = len(self.lengths)
        if layer == 0:
            self._ensure(key_states[:, :, :1].unsqueeze(0), rows=rows, length=self._need_len)
        assert self.buffer is not None and self._cols is not None
        keys, values = self.buffer[layer, 0], self.buffer[layer, 1]
        # [rows, window] positions, one per query: advanced indexing puts them first, hence the transpose.
        keys[self._row_index, :, self._cols] = key_states.transpose(1, 2)
        values[self._row_index, :, self._cols] = value_states.transpose(1, 2)
        return keys[:rows, :, : self._view_len], values[:rows, :, : self._view_len]


@dataclass
class _Entry:
    tokens: torch.Tensor
    kv: torch.Tensor  # [layers, 2, kv_heads, len(tokens), head_dim]
    nbytes: int


class PrefixCache:
    """KV of token sequences, found by longest common prefix; least recently used entries go first.

    Entries are only valid for the weights that computed them: the engine calls ``clear`` on every weight
    change. An entry that another one extends is dropped (the longer one serves every prefix it served).
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"prefix cache size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.entries: OrderedDict[int, _Entry] = OrderedDict()
        self.bytes = 0
        self._next_key = 0
        self.stats = {"hits": 0, "misses": 0, "hit_tokens": 0, "inserts": 0, "evictions": 0, "clears": 0}

    def __len__(self) -> int:
        return len(self.entries)

    def match(self, tokens: torch.Tensor, limit: int, *, record: bool = True) -> tuple[int, torch.Tensor | None]:
        """The longest cached prefix of ``tokens`` (at most ``limit`` long) and its KV view, or ``(0, None)``.

        ``record=False`` only looks: no hit/miss counted, no LRU move.
        """
        best, best_key = 0, None
        for key, entry in self.entries.items():
            n = min(limit, entry.tokens.numel(), tokens.numel())
            if n <= best or n == 0 or int(entry.tokens[0]) != int(tokens[0]):
                continue
            same = entry.tokens[:n] == tokens[:n]
            common = n if bool(same.all()) else int((~same).to(torch.uint8).argmax())
            if common > best:
                best, best_key = common, key
        if not record:
            return best, None if best_key is None else self.entries[best_key].kv[:, :, :, :best]
        if best_key is None:
            self.stats["misses"] += 1
            return 0, None
        self.entries.move_to_end(best_key)
        self.stats["hits"] += 1
        self.stats["hit_tokens"] += best
        return best, self.entries[best_key].kv[:, :, :, :best]

    def insert(self, tokens: torch.Tensor, kv: torch.Tensor) -> bool:
        """Keep ``kv`` (a copy is taken) for ``tokens``; False when it does not fit or adds nothing."""
        nbytes = kv.numel() * kv.element_size()
        n = tokens.numel()
        if n == 0 or nbytes > self.max_bytes:
            return False
        for key, entry in list(self.entries.items()):
            m = entry.tokens.numel()
            if m >= n and torch.equal(entry.tokens[:n], tokens):
                self.entries.move_to_end(key)  # already covered by a longer (or equal) entry
                return False
            if m < n and torch.equal(tokens[:m], entry.tokens):
                self._drop(key)  # the new entry extends this one
        while self.entries and self.bytes + nbytes > self.max_bytes:
            self._drop(next(iter(self.entries)))
            self.stats["evictions"] += 1
        self.entries[self._next_key] = _Entry(tokens.clone(), kv.clone(), nbytes)
        self._next_key += 1
        self.bytes += nbytes
        self.stats["inserts"] += 1
        return True

    def clear(self) -> None:
        if self.entries:
            self.stats["clears"] += 1
        self.entries.clear()
        self.bytes = 0

    def _drop(self, key: int) -> None:
        self.bytes -= self.entries.pop(key).nbytes
