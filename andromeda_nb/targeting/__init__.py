"""Targeting: categories, rules and their I/O, user profiles, the bitset index and its real-time
updates (host side; the match kernels live in :mod:`andromeda_nb.match`)."""

from .index import (CHANGE, CREATE, RETIRE, WORD_BITS, Category, IndexLayout, MatchPlan, RuleError, TargetingIndex,
                    TargetingRules, TargetingSchema, UpdateBatch, UpdateDelta, bit_of, bits_from_mask, choose_layout,
                    host_kernels, last_word_mask, make_profile, mask_from_bits, table_slots, word_of)

__all__ = ["CHANGE", "CREATE", "RETIRE", "WORD_BITS", "Category", "IndexLayout", "MatchPlan", "RuleError",
           "TargetingIndex", "TargetingRules", "TargetingSchema", "UpdateBatch", "UpdateDelta", "bits_from_mask",
           "choose_layout", "make_profile", "mask_from_bits", "table_slots", "bit_of", "host_kernels",
           "last_word_mask", "word_of"]
