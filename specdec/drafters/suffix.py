"""Suffix decoding: draft what has most often followed the context's suffix, in this sequence and in the
sequences this process finished before.

No model. Two indexes of one kind: one per slot over its own sequence (prompt and accepted tokens, indexed as
the context grows, as prompt lookup does), and one shared by all slots over finished sequences (the prompt and
output a slot held when it was closed), kept to at most `max_tokens` tokens by dropping the oldest sequences
whole.

An index is a suffix tree over the sequences' prefixes read backwards, cut at `max_depth` tokens: from the root,
token a leads to the suffix (a), on from there token b to (b, a), and so on; each node counts the tokens that
followed its suffix. Nodes sit only where suffixes part or where an occurrence's context ends (at its sequence's
start, or max_depth back): a run with neither is one edge labelled with its tokens, and a suffix that only one
occurrence has is a leaf pointing at it. So a token costs about two nodes however repetitive the text (some 200
to 700 bytes), and adding one walks a single path: the index grows by the new tokens alone.

A draft is a greedy walk: find the longest suffix of the context (up to max_depth tokens) that either index
knows, take its most frequent next token (ties: the most recent), append that token to the context and look
again. The walk ends at k tokens, when no suffix matches, or when the product of the steps' frequencies
(count / total), the empirical chance that the whole draft follows, would drop below `min_prob`: that is how
many tokens are worth drafting. When both indexes know the longest suffix, their next-token frequencies are
mixed, the sequence's own weighted `local_weight` : 1 (a sequence repeats itself more reliably than others
repeat it), and the better of the two indexes' favourites is drafted.

Cost per round: the context's new tokens, each read and indexed once, then at most 2 (k + 1) walks of
O(max_depth) steps: the context's length and the shared index's size do not enter. Closing a slot indexes its
sequence into the shared index (the cost of indexing it again) and evicts in proportion to what it drops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdec.drafters.base import Draft, Drafter, pad_rows
from specdec.errors import SpecdecError


class _Node:
    """A suffix. total: how many of its occurrences a token followed; counts: by which tokens; best: the most
    frequent of them; kids: longer suffixes, by the token before this one; label: the tokens on the edge in
    from the parent (read backwards). A leaf (kids None) has one occurrence and points at it: its suffix ends at
    seqs[seq][pos - 1] and seqs[seq][pos] followed; its edge runs back from there to max_depth tokens."""

    __slots__ = ("total", "counts", "best", "kids", "label", "seq", "pos")

    def __init__(self, seq: int | None = None, pos: int = 0, label: tuple = ()):
        self.total = 0 if seq is None else 1
        self.counts: dict[int, int] | None = None if seq is not None else {}
        self.best: int | None = None
        self.kids: dict[int, _Node] | None = None if seq is not None else {}
        self.label, self.seq, self.pos = label, seq, pos


def _common(label: tuple, back: tuple, d: int) -> int:
    """How many leading tokens of label equal back[d:] (the first always does: it is the edge's key)."""
    n = min(len(label), len(back) - d)
    if label[:n] == back[d:d + n]:
        return n
    m = 1
    while label[m] == back[d + m]:
        m += 1
    return m


class _SuffixIndex:
    """Occurrences (seq, j): the suffix ending at seqs[seq][j - 1], followed by seqs[seq][j]. Nodes sit where
    suffixes part, where an occurrence's context ends (the sequence's start, or max_depth), and at leaves."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.seqs: dict[int, list[int]] = {}  # oldest first
        self.root = _Node()

    def back(self, toks: Sequence[int], j: int) -> tuple:
        """The context before toks[j], read backwards: at most max_depth tokens."""
        return tuple(toks[max(0, j - self.max_depth):j][::-1])

    def _label(self, kid: _Node, d: int) -> tuple:
        """The edge into kid, which leaves depth d."""
        return kid.label if kid.kids is not None else self.back(self.seqs[kid.seq], kid.pos)[d:]

    def add(self, sid: int, j: int) -> None:
        toks = self.seqs[sid]
        t, back = toks[j], self.back(toks, j)
        node, d = self.root, 0
        while d < len(back):
            kid = node.kids.get(back[d])
            if kid is None:
                node.kids[back[d]] = _Node(sid, j)
                return
            label = kid.label if kid.kids is not None else self._label(kid, d)
            m = 1 if len(label) == 1 else _common(label, back, d)
            if m < len(label) or kid.kids is None:  # the two occurrences part (or one's context ends) here
                kid = self._split(node, back[d], kid, label, m)
            kid.total += 1
            c = kid.counts[t] = kid.counts.get(t, 0) + 1
            if c >= kid.counts[kid.best]:  # >=: ties go to the most recent
                kid.best = t
            node, d = kid, d + m

    def _split(self, parent: _Node, key: int, kid: _Node, label: tuple, m: int) -> _Node:
        """A node m tokens down the edge into kid, holding kid's occurrences (a leaf that ends there is
        replaced)."""
        mid = _Node(label=label[:m])
        if kid.kids is None:
            mid.total, mid.best = 1, self.seqs[kid.seq][kid.pos]
            mid.counts[mid.best] = 1
        else:
            mid.total, mid.counts, mid.best = kid.total, dict(kid.counts), kid.best
            kid.label = label[m:]
        if m < len(label):
            mid.kids[label[m]] = kid
        parent.kids[key] = mid
        return mid

    def remove(self, sid: int, j: int) -> None:
        toks = self.seqs[sid]
        t, back = toks[j], self.back(toks, j)
        path, node, d = [], self.root, 0
        while d < len(back):
            kid = node.kids[back[d]]
            path.append((node, back[d], kid))
            kid.total -= 1
            if not kid.total:  # a leaf, or a node only this occurrence reached
                break
            c = kid.counts.pop(t) - 1
            if c:
                kid.counts[t] = c
            if t == kid.best:  # (a tie now goes to the token counted first)
                kid.best = max(kid.counts, key=kid.counts.__getitem__)
            node, d = kid, d + len(kid.label)
        for parent, key, kid in reversed(path):
            if not kid.total:
                del parent.kids[key]
            elif len(kid.kids) == 1:
                (child,) = kid.kids.values()
                if child.total == kid.total:  # nothing parts or ends at kid any more: one edge
                    if child.kids is not None:
                        child.label = kid.label + child.label
                    parent.kids[key] = child

    def match(self, back: tuple) -> tuple[_Node, int]:
        """The node of the longest suffix the index knows of a context read backwards (`back`), and that
        suffix's length (0: none). Inside an edge the suffix has the occurrences of the node below."""
        node, d = self.root, 0
        while d < len(back):
            kid = node.kids.get(back[d])
            if kid is None:
                break
            label = kid.label if kid.kids is not None else self._label(kid, d)
            m = 1 if len(label) == 1 else _common(label, back, d)
            node, d = kid, d + m
            if m < len(label) or kid.kids is None:
                break
        return node, d

    def top(self, node: _Node) -> int:
        return node.best if node.kids is not None else self.seqs[node.seq][node.pos]

    def share(self, node: _Node, t: int) -> float:
        """How often t followed the node's suffix: count / total."""
        if node.kids is None:
            return float(self.seqs[node.seq][node.pos] == t)
        return node.counts.get(t, 0) / node.total

    def size(self) -> int:
        """Nodes, root included (for tests: what the index holds)."""
        n, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            n += 1
            stack.extend(node.kids.values() if node.kids else ())
        return n


class _SharedIndex(_SuffixIndex):
    """The finished sequences, at most max_tokens tokens in all: the oldest go first, whole."""

    def __init__(self, max_depth: int, max_tokens: int):
        super().__init__(max_depth)
        self.max_tokens, self.held, self.next_id = max_tokens, 0, 0

    def add_sequence(self, toks: list[int]) -> None:
        toks = toks[len(toks) - self.max_tokens:] if len(toks) > self.max_tokens else toks  # its most recent part
        if len(toks) < 2:  # no occurrence: nothing followed anything
            return
        while self.held + len(toks) > self.max_tokens:
            self.evict_oldest()
        sid, self.next_id = self.next_id, self.next_id + 1
        self.seqs[sid] = toks
        self.held += len(toks)
        for j in range(1, len(toks)):
            self.add(sid, j)

    def evict_oldest(self) -> None:
        sid = next(iter(self.seqs))
        for j in range(1, len(self.seqs[sid])):
            self.remove(sid, j)
        self.held -= len(self.seqs.pop(sid))


def _favourite(parts: list[tuple[_SuffixIndex, _Node, float]]) -> tuple[int, float]:
    """(token, probability): the likelier of the parts' favourites under their weighted mixture (ties: the
    first part's)."""
    weight = sum(w for _, _, w in parts)
    best, best_q = -1, -1.0
    for t in [index.top(node) for index, node, _ in parts]:
        q = sum(w * index.share(node, t) for index, node, w in parts) / weight
        if q > best_q:
            best, best_q = t, q
    return best, best_q


@dataclass
class _Row:
    tokens: list[int]  # the sequence as far as the drafter has seen it
    index: _SuffixIndex  # over tokens (as sequence 0)
    indexed_to: int = 1  # occurrences (0, j) for j < indexed_to are in the index
    ctx: Sequence[int] | None = None  # the context last passed to propose


class SuffixDrafter(Drafter):
    name = "suffix"
    free = True
    confident = False
    taps = ()
    catch_up_s = 0.0

    def __init__(self, max_depth: int = 24, min_prob: float = 0.1, max_tokens: int = 1 << 18,
                 local_weight: float = 2.0):
        """max_depth: the longest suffix matched. min_prob: drafting stops before the draft's empirical
        probability falls below it. max_tokens: the finished sequences' tokens kept (0: learn nothing across
        sequences); each costs some 200 to 700 bytes of index.
        local_weight: the sequence's own statistics against the finished sequences', when both match."""
        if not isinstance(max_depth, int) or max_depth < 1:
            raise SpecdecError(f"suffix drafter: max_depth must be a whole number >= 1, got {max_depth!r}")
        if not 0.0 <= min_prob <= 1.0:
            raise SpecdecError(f"suffix drafter: min_prob must lie in [0, 1], got {min_prob!r}")
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise SpecdecError(f"suffix drafter: max_tokens must be a whole number >= 0, got {max_tokens!r}")
        if not local_weight > 0.0:
            raise SpecdecError(f"suffix drafter: local_weight must be positive, got {local_weight!r}")
        self.max_depth, self.min_prob, self.local_weight = max_depth, min_prob, local_weight
        self.shared = _SharedIndex(max_depth, max_tokens)
        self.learns = max_tokens > 0  # finished sequences feed the shared index
        self.rows: dict[int, _Row] = {}  # slot -> its sequence

    def reserve(self, slots: int, capacity: int, huge_pages: bool = True) -> int:
        return capacity

    def open(self, slot: int, prompt: Sequence[int] = (), sampling=None) -> None:
        index = _SuffixIndex(self.max_depth)
        row = self.rows[slot] = _Row(list(prompt), index)
        index.seqs[0] = row.tokens

    def close(self, slot: int) -> None:
        """The sequence joins the shared index: as the last context passed to propose stands now (the engine's
        context list grows in place, so this includes the last round's tokens), or else its prompt."""
        row = self.rows.pop(slot, None)
        if row is None:
            return
        if row.ctx is not None and len(row.ctx) > len(row.tokens):
            row.tokens.extend(row.ctx[len(row.tokens):len(row.ctx)])
        self.shared.add_sequence(row.tokens)

    def _sync(self, slot: int, ctx: Sequence[int]) -> _Row:
        """Index the tokens the context gained since the last round (contexts only grow)."""
        row = self.rows[slot]
        row.ctx = ctx
        if len(ctx) > len(row.tokens):
            row.tokens.extend(ctx[len(row.tokens):len(ctx)])
        for j in range(row.indexed_to, len(row.tokens)):
            row.index.add(0, j)
        row.indexed_to = max(row.indexed_to, len(row.tokens))
        return row

    def draft(self, row: _Row, k: int) -> list[int]:
        """Up to k tokens by the greedy walk, while their probability stays at min_prob or above."""
        tail = row.tokens[-self.max_depth:]  # the walk reads no further back
        out, p = [], 1.0
        while len(out) < k:
            back = tuple(tail[:-self.max_depth - 1:-1])
            own, d_own = row.index.match(back)
            other, d_other = self.shared.match(back)
            d = max(d_own, d_other)
            if d == 0:
                break
            parts = ([(row.index, own, self.local_weight)] if d_own == d else []) + \
                    ([(self.shared, other, 1.0)] if d_other == d else [])
            tok, q = _favourite(parts)
            p *= q
            if p < self.min_prob:
                break
            out.append(tok)
            tail.append(tok)
        return out

    def propose(self, slots, contexts, ks) -> Draft:
        rows = [self.draft(self._sync(s, ctx), k) if k > 0 else [] for s, ctx, k in zip(slots, contexts, ks)]
        return Draft(pad_rows(rows, max(ks, default=0)))

    def accepted(self, slots, num_accepted) -> None:
        pass
