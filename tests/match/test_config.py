"""MatchConfig: validation before anything launches, and the documented "auto" rules."""

import numpy as np
import pytest

from andromeda_nb.device import launch
from andromeda_nb.match import MatchConfig
from andromeda_nb.match.config import GPU_MATCH_BLOCK, MAX_GROUP, MAX_SEGMENT_ROWS, THREADS_PER_SM_BOUNDS


def test_defaults():
    c = MatchConfig()
    assert (c.words_per_thread, c.block, c.blocks_per_sm, c.min_blocks_per_sm, c.group, c.prefetch,
            c.list_kernels) == (8, "auto", 8, "auto", 0, False, "auto")
    with pytest.raises(AttributeError):
        c.group = 2  # frozen


def test_refuses_bad_group():
    for bad in (-1, 2.5, 0.5, True, "2", MAX_GROUP + 1, 2**40, None):
        with pytest.raises(ValueError, match="group must be an int"):
            MatchConfig(group=bad)
    for g in (1, 2):
        with pytest.raises(ValueError, match="exclude each other"):
            MatchConfig(group=g, prefetch=True)
    assert MatchConfig(group=np.int8(MAX_GROUP)).group == MAX_GROUP


@pytest.mark.parametrize("field,bad,msg", [
    ("words_per_thread", 0, "words_per_thread must be an int"),
    ("words_per_thread", 65, "words_per_thread must be an int"),
    ("words_per_thread", 4.0, "words_per_thread must be an int"),
    ("words_per_thread", False, "words_per_thread must be an int"),
    ("block", 0, "block must be 'auto' or an int in 1..1024"),
    ("block", 1025, "block must be 'auto' or an int in 1..1024"),
    ("block", None, "block must be 'auto' or an int in 1..1024"),
    ("block", "256", "block must be 'auto' or an int in 1..1024"),
    ("blocks_per_sm", 0, "blocks_per_sm must be a positive int"),
    ("blocks_per_sm", "auto", "blocks_per_sm must be a positive int"),
    ("min_blocks_per_sm", -1, "min_blocks_per_sm must be 'auto' or an int >= 0"),
    ("min_blocks_per_sm", None, "min_blocks_per_sm must be 'auto' or an int >= 0"),
    ("prefetch", 1, "prefetch must be a bool"),
    ("prefetch", "yes", "prefetch must be a bool"),
    ("list_kernels", "grid", "list_kernels must be one of"),
    ("list_kernels", None, "list_kernels must be one of"),
])
def test_refuses_bad_fields(field, bad, msg):
    with pytest.raises(ValueError, match=msg):
        MatchConfig(**{field: bad})


def test_fields_become_plain_python_values():
    """A numpy int8 or uint32 would wrap in the launch arithmetic (grid and tile sizes)."""
    c = MatchConfig(words_per_thread=np.int8(4), block=np.uint32(128), blocks_per_sm=np.int64(2),
                    min_blocks_per_sm=np.int16(3), group=np.uint8(2), prefetch=False)
    for name in ("words_per_thread", "block", "blocks_per_sm", "min_blocks_per_sm", "group"):
        assert type(getattr(c, name)) is int
    assert type(MatchConfig(prefetch=np.bool_(True)).prefetch) is bool


def test_auto_block():
    assert MatchConfig().block_size(simulator=True) == launch.SIM_BLOCK
    assert MatchConfig().block_size(simulator=False) == GPU_MATCH_BLOCK == 256
    assert MatchConfig(block=96).block_size(simulator=True) == 96


def test_auto_launch_bounds():
    """``THREADS_PER_SM_BOUNDS[words_per_thread] // block`` on a GPU, none for other shapes and
    in the simulator; an explicit value is kept."""
    assert THREADS_PER_SM_BOUNDS == {4: 1024, 8: 768, 16: 512}
    gpu = {U: MatchConfig(words_per_thread=U).launch_bounds(simulator=False) for U in (1, 2, 4, 8, 16)}
    assert gpu == {1: 0, 2: 0, 4: 4, 8: 3, 16: 2}
    assert MatchConfig(words_per_thread=4, block=512).launch_bounds(simulator=False) == 2
    assert MatchConfig(min_blocks_per_sm=0).launch_bounds(simulator=False) == 0
    assert MatchConfig(min_blocks_per_sm=5).launch_bounds(simulator=False) == 5
    assert MatchConfig(min_blocks_per_sm=5).launch_bounds(simulator=True) == 0
    assert MatchConfig().launch_bounds(simulator=True) == 0


def test_list_pass_rule():
    """"auto" is the search passes; "segment" falls back to them past the grid's y limit."""
    for n in (0, 1, MAX_SEGMENT_ROWS, MAX_SEGMENT_ROWS + 1):
        assert MatchConfig().list_pass(n) == "search"
        assert MatchConfig(list_kernels="search").list_pass(n) == "search"
    assert MatchConfig(list_kernels="segment").list_pass(MAX_SEGMENT_ROWS) == "segment"
    assert MatchConfig(list_kernels="segment").list_pass(MAX_SEGMENT_ROWS + 1) == "search"
    assert MAX_SEGMENT_ROWS == 65535
