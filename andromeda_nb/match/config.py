"""How a prepared batch of requests is launched: the match kernel's shape and variant, and which
list passes run around it (:class:`MatchConfig`, passed as ``config=`` to
:meth:`~andromeda_nb.match.api.DeviceTargetingIndex.launch`, :func:`~andromeda_nb.match.api.match_eligible`
and :func:`~andromeda_nb.match.api.match_batch`; :func:`~andromeda_nb.match.byte_model.read_model`
models the same variant). Every variant returns the same bitsets and counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..arguments import is_int

#: Largest ``group``: each thread holds ``group * words_per_thread`` loaded words in registers.
MAX_GROUP = 64
#: Largest ``words_per_thread`` (the words a thread keeps in registers per row).
MAX_WORDS_PER_THREAD = 64
#: Launch bounds of the ``"auto"`` rule, per words per thread: the resident threads per SM the
#: compiler must allow (it caps registers accordingly). With these bounds sm_90 ptxas spills
#: nothing: 4 words 64 registers (1,024 threads), 8 words 78 (768 threads), 16 words 124 (512
#: threads); other shapes get no bounds.
THREADS_PER_SM_BOUNDS = {4: 1024, 8: 768, 16: 512}
#: Most segments a segment-grid list pass launches (one block row a segment; the grid's y limit).
MAX_SEGMENT_ROWS = 65535
#: The match kernel's threads per block on a GPU (``block="auto"``; the simulator runs a block's
#: threads as Python threads and gets :data:`andromeda_nb.device.launch.SIM_BLOCK`).
GPU_MATCH_BLOCK = 256
LIST_KERNEL_CHOICES = ("auto", "search", "segment")


@dataclass(frozen=True)
class MatchConfig:
    """The launch of a prepared batch (validated here, before anything launches).

    Fields:
        words_per_thread: words of each row a match thread loads together (loads in flight per
            row); default 8, the fastest of 1 / 2 / 4 / 8 / 16 measured on the H200
            (data/results/targeting.csv, ``match_U*_b256`` rows).
        block: the match kernel's threads per block, or ``"auto"``: 256 on a GPU, the
            simulator's small block under the simulator.
        blocks_per_sm: resident match blocks per SM the grid asks for (the grid is at most
            ``SMs * blocks_per_sm`` blocks per request, grid-striding over the words); default 8.
        min_blocks_per_sm: launch bounds ``(block, min_blocks_per_sm)`` (the compiler caps
            registers so that many blocks fit on an SM); 0 for none, or ``"auto"``:
            ``THREADS_PER_SM_BOUNDS[words_per_thread] // block`` (0 for other shapes). Under the
            simulator, which takes no launch bounds, always none.
        group: rows the grouped match kernel loads together
            (:func:`~andromeda_nb.match.kernels.match_grouped_kernel`), ``1..MAX_GROUP``; 0
            (default): the plain kernel, one row at a time with per-row early exit.
        prefetch: the plain kernel variant that loads each category's first include row one
            category ahead (:func:`~andromeda_nb.match.kernels.match_kernel`); off by default: it
            measured slower on the H200 (data/results/targeting.csv, ``*_prefetch`` rows). Not
            combined with ``group``.
        list_kernels: the list passes around the match: ``"search"`` (a grid-stride pass over
            all entries, each finding its segment by binary search: ``prep_kernel`` /
            ``post_kernel``), ``"segment"`` (a block row per segment, ``SEG_LOADS`` loads a thread
            in flight: ``prep_segment_kernel`` / ``post_segment_kernel``; a batch with more than
            ``MAX_SEGMENT_ROWS`` segments falls back to ``"search"``), or ``"auto"``: ``"search"``,
            until the segment grid is measured faster on the GPU (the ``stages`` rows of
            data/results/targeting.csv time the passes).

    Raises:
        ValueError: a field out of its range, or ``group`` with ``prefetch``.
    """

    words_per_thread: int = 8
    block: int | str = "auto"
    blocks_per_sm: int = 8
    min_blocks_per_sm: int | str = "auto"
    group: int = 0
    prefetch: bool = False
    list_kernels: str = "auto"

    def __post_init__(self):
        U = self.words_per_thread
        if not is_int(U) or not 1 <= U <= MAX_WORDS_PER_THREAD:
            raise ValueError(f"words_per_thread must be an int in 1..{MAX_WORDS_PER_THREAD}, got {U!r}")
        if self.block != "auto" and (not is_int(self.block) or not 1 <= self.block <= 1024):
            raise ValueError(f"block must be 'auto' or an int in 1..1024 (threads per block), got {self.block!r}")
        if not is_int(self.blocks_per_sm) or self.blocks_per_sm < 1:
            raise ValueError(f"blocks_per_sm must be a positive int, got {self.blocks_per_sm!r}")
        mb = self.min_blocks_per_sm
        if mb != "auto" and (not is_int(mb) or mb < 0):
            raise ValueError(f"min_blocks_per_sm must be 'auto' or an int >= 0 (0: no launch bounds), got {mb!r}")
        G = self.group
        if not is_int(G) or not 0 <= G <= MAX_GROUP:
            raise ValueError(f"group must be an int in 0..{MAX_GROUP} (rows loaded together; 0: the plain "
                             f"kernel), got {G!r}")
        if not isinstance(self.prefetch, (bool, np.bool_)):
            raise ValueError(f"prefetch must be a bool, got {self.prefetch!r}")
        if G and self.prefetch:
            raise ValueError(f"group={G} and prefetch=True exclude each other (prefetch is a variant of the "
                             "plain kernel, group=0)")
        if not isinstance(self.list_kernels, str) or self.list_kernels not in LIST_KERNEL_CHOICES:
            raise ValueError(f"list_kernels must be one of {LIST_KERNEL_CHOICES}, got {self.list_kernels!r}")
        # plain ints and bools: a numpy int8 or uint32 would wrap in the launch arithmetic
        for name in ("words_per_thread", "blocks_per_sm", "group"):
            object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("block", "min_blocks_per_sm"):
            if getattr(self, name) != "auto":
                object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "prefetch", bool(self.prefetch))

    def block_size(self, simulator: bool) -> int:
        """The match kernel's threads per block (``block``, or the ``"auto"`` rule)."""
        if self.block != "auto":
            return self.block
        from ..device import launch

        return launch.SIM_BLOCK if simulator else GPU_MATCH_BLOCK

    def launch_bounds(self, simulator: bool) -> int:
        """The match kernel's minimum resident blocks per SM (0: no launch bounds)."""
        if simulator:
            return 0
        if self.min_blocks_per_sm != "auto":
            return self.min_blocks_per_sm
        return THREADS_PER_SM_BOUNDS.get(self.words_per_thread, 0) // self.block_size(False)

    def list_pass(self, n_segments: int) -> str:
        """The list passes (``"search"`` or ``"segment"``) for a batch of ``n_segments`` segments."""
        if self.list_kernels == "segment" and n_segments <= MAX_SEGMENT_ROWS:
            return "segment"
        return "search"
