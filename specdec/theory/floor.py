"""What a pass over n token-rows should cost on this machine: the floor every kernel change is judged by.

A pass reads the weights once (however many rows it carries) and the sequence's cached keys and values once (the
attention kernel shares them between its rows); it multiplies each row through every matrix. Its floor is

    floor(n) = max(bytes / bandwidth, n * products / product_rate) + n * per_row

- `bytes`: the weight bytes a token reads plus the KV-cache bytes of the context it attends to;
- `products`: the multiply-adds of the matrix products of one row, at the rate the model's path issues them
  (int8 block dot products for gguf-q8, two of them a multiply-add for gguf-q16, fp32 FMAs otherwise);
- `per_row`: the work no row can share with another: its attention over the context (scores and weighted values)
  at the rate its KV cache type allows (fp32 FMAs over an f16 cache; int8 dot products over q8_0 and q4_0, whose
  scores and value sums are integer), and at the fp32 FMA rate its norms and activations, and the softmax over
  the vocabulary where it is sampled.

A prompt's floor (`prompt_floor`, the time to first token's): every position's products at their rate, its
attention over the positions before it at the cache type's rate, the LM head once.

The most of its short-context speed decoding keeps at a long context when both passes take just the time to read
their bytes (`kept_ceiling`): the ratio of those bytes. A short pass slower than its reading leaves a long one more
room; a decoder at its floor keeps no more. When the short pass is as measured and the long one adds only the time
to read its extra cache at the measured read rate (`kept_at_read_rate`), it keeps less than the bytes' ratio where
the short pass beats its bytes' time: where a cache larger than the model holds the weights between passes.

Whichever of reading and multiplying takes longer binds; a kernel that overlaps the other with it entirely meets
the floor. All rates are measured on the machine the floor is printed for (bench/hardware/profile.py), so a
measured pass "at 1.1x its floor" means the same on any CPU. Pure arithmetic: nothing here measures.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PassWork:
    """One pass's work, independent of the machine. `attention_macs` and `kv_bytes` at the context measured."""

    weight_bytes: float  # read once a pass
    kv_bytes: float  # the context's cached keys and values, read once a pass
    product_macs: float  # a row's multiply-adds in the matrix products
    attention_macs: float  # a row's multiply-adds in attention over the context
    elementwise: float  # a row's other arithmetic (norms, activations, softmax over the vocabulary), in operations


@dataclass(frozen=True)
class Rates:
    """This machine's, measured: read bandwidth (bytes/s), the products' multiply-add rate on the model's path and
    the fp32 FMA rate (multiply-adds/s, all threads); attention's rate where its cache type is not fp32 FMAs'
    (the int8 dot products' over q8_0 and q4_0; None: the fp32 FMA rate)."""

    bandwidth: float
    product_rate: float
    fma_rate: float
    attention_rate: float | None = None

    @property
    def attention(self) -> float:
        return self.attention_rate or self.fma_rate


@dataclass(frozen=True)
class Floor:
    rows: int
    memory_s: float  # reading the weights and the cache
    products_s: float  # the rows' matrix products
    per_row_s: float  # the unshared work of all the rows together

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.products_s) + self.per_row_s

    @property
    def binds(self) -> str:
        return "memory" if self.memory_s >= self.products_s else "arithmetic"


def pass_floor(rows: int, work: PassWork, rates: Rates) -> Floor:
    if rows < 1:
        raise ValueError(f"a pass has at least one row, not {rows}")
    per_row = work.attention_macs / rates.attention + work.elementwise / rates.fma_rate
    return Floor(rows, (work.weight_bytes + work.kv_bytes) / rates.bandwidth,
                 rows * work.product_macs / rates.product_rate, rows * per_row)


@dataclass(frozen=True)
class PromptFloor:
    tokens: int
    products_s: float  # every position's matrix products, the LM head once
    attention_s: float  # every position's attention over the positions up to it

    @property
    def seconds(self) -> float:
        return self.products_s + self.attention_s


def prompt_floor(tokens: int, product_macs: float, head_macs: float, attention_macs: float,
                 rates: Rates) -> PromptFloor:
    """A prompt of `tokens` tokens: product_macs a row (the LM head's head_macs among them, counted once), and
    attention_macs over the whole prompt (the sum over its positions)."""
    if tokens < 1:
        raise ValueError(f"a prompt has at least one token, not {tokens}")
    products = tokens * (product_macs - head_macs) + head_macs
    return PromptFloor(tokens, products / rates.product_rate, attention_macs / rates.attention)


def kept_ceiling(weight_bytes: float, kv_bytes_per_position: float, short_positions: float,
                 long_positions: float) -> float:
    """The most of its short-context decoding speed a one-row pass keeps at a long context when both passes take just
    the time to read their bytes at one bandwidth (the weights, plus each context's cached keys and values): the
    ratio of those bytes. Passes that spend longer than their reading on the same other work keep more of a slower
    speed (short_s / (short_s + extra cache bytes / bandwidth)); a decoder at its floor keeps no more than this, and a
    goal near it asks attention to read the cache at the weights' rate with all its arithmetic hidden."""
    if weight_bytes <= 0 or kv_bytes_per_position < 0 or not 0 <= short_positions <= long_positions:
        raise ValueError("weights read, bytes a position, and 0 <= short <= long positions")
    return (weight_bytes + kv_bytes_per_position * short_positions) / (weight_bytes + kv_bytes_per_position
                                                                         * long_positions)


def kept_at_read_rate(short_s: float, extra_bytes: float, bytes_per_s: float) -> float:
    """The most of its short-context decoding speed a pass keeps if it costs the short pass's measured time (short_s
    a token) plus the time to read the extra cached keys and values of the long context (extra_bytes) at the
    machine's read rate. Where the short pass reads its weights faster than that rate (from a last-level cache
    that holds the model between passes), this is below `kept_ceiling`. It takes the rest of the pass to cost the
    same at both lengths: a cache that displaces the weights from that last-level cache slows the rest too
    (docs/results/kv-cache-long-context.md, "Attention from memory")."""
    if short_s <= 0 or extra_bytes < 0 or bytes_per_s <= 0:
        raise ValueError("a short pass's time, extra bytes >= 0 and a read rate > 0")
    return short_s / (short_s + extra_bytes / bytes_per_s)
