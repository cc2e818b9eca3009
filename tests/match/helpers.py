"""The match check every match test uses, and the algorithms every match test runs."""

import numpy as np

from andromeda_nb import reference
from andromeda_nb.match import DeviceTargetingIndex, Eligible, MatchConfig
from andromeda_nb.targeting import TargetingIndex, make_profile, mask_from_bits

#: Every match algorithm: both list passes around the match, the plain kernel without and with
#: prefetch, and the grouped kernel (a group that divides no plan's row count evenly in general).
ALGORITHMS = tuple(MatchConfig(list_kernels=lists, group=group, prefetch=prefetch)
                   for lists in ("search", "segment") for group, prefetch in ((0, False), (0, True), (3, False)))


def config_id(config: MatchConfig) -> str:
    """A short pytest id: list passes, kernel variant, and any non-default shape."""
    kernel = f"grouped{config.group}" if config.group else ("prefetch" if config.prefetch else "plain")
    shape = "" if config.words_per_thread == MatchConfig.words_per_thread else f"-U{config.words_per_thread}"
    return f"{config.list_kernels}-{kernel}{shape}"


def check_match(index, profile, got, rules=None, exclude_slots=None, n_words=None) -> np.ndarray:
    """Assert one request's eligible set equals the rule oracle's (:func:`andromeda_nb.reference.match`).

    Args:
        index: the :class:`TargetingIndex` or :class:`DeviceTargetingIndex` that answered.
        profile: the request's profile (as given to the match).
        got: an :class:`Eligible`, or ``(words, count)`` with ``words`` a host or device uint64
            bitset (at least the matched words) and ``count`` an int.
        rules: the pool's rules in slot order; default the host index's current rules (its ad id
            -> (slot, rule) map, the truth after updates; pass them when a device copy answered
            for an earlier version than its host's).
        exclude_slots: the request's exclude slots (removed from the oracle's answer).
        n_words: the matched prefix of the pool, in words (default all).

    Checks the bits (padding bits past the matched span never set), the count, and that the CPU
    baseline (:meth:`TargetingIndex.match_cpu`, when the host keeps its bits and is at the version
    that answered) gives the same words and count. Returns the oracle's mask.
    """
    host = index.index if isinstance(index, DeviceTargetingIndex) else index
    assert isinstance(host, TargetingIndex)
    rules = host.current_rules() if rules is None else rules
    nw = host.n_words if n_words is None else int(n_words)
    n_bits = min(host.n_ads, nw * 64)
    want = np.zeros(host.n_ads, bool)
    want[:rules.n_ads] = reference.match(rules, make_profile(host.schema, profile))
    want = want[:n_bits]
    if exclude_slots is not None:
        ex = np.asarray(exclude_slots, np.int64)
        want[ex[ex < n_bits]] = False
    if isinstance(got, Eligible):
        words, count = got.words, got.count
    else:
        words, count = got
    words = words.copy_to_host() if hasattr(words, "copy_to_host") else np.asarray(words)
    assert words.dtype == np.uint64 and words.ndim == 1 and words.size >= nw
    words = words[:nw]
    np.testing.assert_array_equal(mask_from_bits(words, n_bits), want)
    assert int(count) == int(want.sum())
    if n_bits % 64:
        assert int(words[-1]) >> (n_bits % 64) == 0, "padding bits must never match"
    same_version = not isinstance(index, DeviceTargetingIndex) or index.version == host.version
    if host.host_bits and same_version:
        cpu_words, cpu_count = host.match_cpu(profile, exclude_slots, n_words=nw)
        np.testing.assert_array_equal(cpu_words, words)
        assert cpu_count == int(count)
    return want
