"""Targeting rules: one include and one exclude value set per category per ad, and their I/O.

An ad's rule holds, per category, an include set ``I_c`` (empty = unconstrained) and an exclude
set ``X_c`` (docs/design.md, "Targeting")::

    match(ad, user) = ad is live and for all c:
                      (I_c empty or I_c & U_c non-empty) and (X_c & U_c empty)

Rule format
-----------
One record per ad, as a list of dicts, JSON lines (:meth:`TargetingRules.from_jsonl`, one object a
line) or a long pandas DataFrame (:meth:`TargetingRules.from_frame`)::

    {"ad_id": 17, "live": true,
     "include": {"age": [2, 3], "interests": [40, 41]},
     "exclude": {"country": [7]}}

``ad_id`` is a non-negative int, unique in the pool; ``live`` a bool (default true); ``include`` and
``exclude`` map a category name to a list of value ids ``0..m_c-1`` (order and repeats do not
matter; an empty or missing list means "no constraint"). Large pools skip per-ad records with
:meth:`TargetingRules.from_columns` (CSR arrays per category). Every path validates and raises
:class:`~andromeda_nb.targeting.schema.RuleError` naming the ad (or record / line) and the category.
Updates use the same records with an ``"op"`` field (:class:`~andromeda_nb.targeting.updates.UpdateBatch`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from .schema import RuleError, TargetingSchema, value_set

#: Largest ad id (ids are stored as int64).
MAX_AD_ID = np.iinfo(np.int64).max
#: The layout :meth:`TargetingRules.save` writes (its ``rules.json`` names it).
_SAVED_FORMAT = "andromeda-nb rules 1"
#: Slots per parallel chunk of the rule-column scan.
_SCAN_CHUNK = 1 << 16


@dataclass(frozen=True)
class AdRule:
    """One ad's targeting: include / exclude value sets per category name, and the live flag.
    A free slot of an index reads as ``AdRule(-1, {}, {}, False)``."""

    ad_id: int
    include: Mapping[str, frozenset]
    exclude: Mapping[str, frozenset]
    live: bool = True


def check_csr_column(kind: str, name: str, m: int, ptr, vals, n: int, ids) -> tuple[np.ndarray, np.ndarray]:
    """Validate one CSR column and return it canonical (int64 indptr, int32 sorted distinct values)."""
    ptr, vals = np.asarray(ptr), np.asarray(vals)
    if ptr.shape != (n + 1,) or (ptr.size and ptr.dtype.kind not in "iu"):
        raise RuleError(f"{kind}, category {name!r}: indptr must be ({n + 1},) integers")
    if vals.ndim != 1 or (vals.size and vals.dtype.kind not in "iu"):
        raise RuleError(f"{kind}, category {name!r}: values must be a 1-D integer array")
    ptr = np.ascontiguousarray(ptr, dtype=np.int64)
    if ptr[0] != 0 or ptr[-1] != vals.size:
        raise RuleError(f"{kind}, category {name!r}: malformed indptr (must start at 0 and end at len(values))")
    if vals.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        if vals.size and (vals.min() < np.iinfo(np.int64).min or vals.max() > np.iinfo(np.int64).max):
            raise RuleError(f"{kind}, category {name!r}: value out of range 0..{m - 1}")
        vals = vals.astype(np.int64)
    v64 = np.ascontiguousarray(vals)
    if n == 0:
        return ptr, np.zeros(0, np.int32)
    from .build_kernels import csr_scan

    n_chunks = -(-n // _SCAN_CHUNK)
    res = np.empty(2 * n_chunks, np.int64)
    csr_scan(ptr, v64, m, _SCAN_CHUNK, res)
    status = res[:n_chunks]
    worst = int(status.max())
    if worst == 3:
        raise RuleError(f"{kind}, category {name!r}: malformed indptr (decreasing)")
    if worst == 2:
        at = int(res[n_chunks + int(np.flatnonzero(status == 2)[0])])
        slot = int(np.searchsorted(ptr, at, side="right") - 1)
        raise RuleError(f"ad {int(ids[slot])} ({kind}), category {name!r}: "
                        f"value {int(v64[at])} out of range 0..{m - 1}")
    if worst == 0:
        return ptr, (vals if vals.dtype == np.int32 else v64.astype(np.int32))
    slots = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
    key = np.unique(slots * m + v64.astype(np.int64))  # sort and de-duplicate per ad
    new_slots, new_vals = key // m, (key % m).astype(np.int32)
    new_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(new_slots, minlength=n), out=new_ptr[1:])
    return new_ptr, new_vals


class TargetingRules:
    """The rules of every ad in the pool, stored by column (scales to 10^8 ads).

    Slot ``i`` holds ad ``ad_ids[i]`` (``-1``: a free slot of an index, see
    :meth:`TargetingIndex.current_rules`). Per category name, ``include[name]`` and
    ``exclude[name]`` are CSR pairs ``(indptr int64[n_ads + 1], values int32[nnz])``: ad ``i``'s set
    is ``values[indptr[i]:indptr[i + 1]]`` (sorted, no duplicates; empty include = unconstrained).

    Build with :meth:`from_records`, :meth:`from_jsonl`, :meth:`from_frame` or
    :meth:`from_columns`; all validate.
    """

    def __init__(self, schema: TargetingSchema, ad_ids, live, include, exclude):
        self.schema = schema
        self.ad_ids = ad_ids
        self.live = live
        self.include = include
        self.exclude = exclude

    @property
    def n_ads(self) -> int:
        return int(self.ad_ids.shape[0])

    def rule(self, slot: int) -> AdRule:
        """Slot ``slot``'s rule as sets (for the oracle and for inspection)."""
        def sets(csr):
            out = {}
            for name, (ptr, vals) in csr.items():
                s = frozenset(int(v) for v in vals[ptr[slot]:ptr[slot + 1]])
                if s:
                    out[name] = s
            return out

        return AdRule(int(self.ad_ids[slot]), sets(self.include), sets(self.exclude), bool(self.live[slot]))

    @property
    def rules(self) -> list[AdRule]:
        """Every slot's :class:`AdRule` (Python objects, built once and cached: for small pools)."""
        if getattr(self, "_rules", None) is None:
            self._rules = [self.rule(i) for i in range(self.n_ads)]
        return self._rules

    def subset(self, slots) -> "TargetingRules":
        """The rules of some slots (in the given order) as a new, smaller TargetingRules: e.g. a
        sample of a 10^8-ad pool for the oracle. Vectorised.

        Raises:
            TypeError: ``slots`` not integers (a boolean mask would read as slots 0 and 1);
            ValueError: a slot out of range.
        """
        slots = np.asarray(slots)
        if slots.size and slots.dtype.kind not in "iu":
            raise TypeError(f"slots must be integers, got {slots.dtype} (for a mask, pass np.flatnonzero(mask))")
        slots = slots.astype(np.int64, copy=False).reshape(-1)
        if slots.size and (int(slots.min()) < 0 or int(slots.max()) >= self.n_ads):
            raise ValueError(f"slots must lie in 0..{self.n_ads - 1}")

        def take(csr):
            out = {}
            for name, (ptr, vals) in csr.items():
                lo, hi = ptr[slots], ptr[slots + 1]
                sizes = hi - lo
                new_ptr = np.zeros(slots.size + 1, np.int64)
                np.cumsum(sizes, out=new_ptr[1:])
                idx = np.repeat(lo - new_ptr[:-1], sizes) + np.arange(int(new_ptr[-1]))
                out[name] = (new_ptr, vals[idx])
            return out

        return TargetingRules(self.schema, self.ad_ids[slots], self.live[slots], take(self.include),
                              take(self.exclude))

    def restrict(self, categories: Iterable[str]) -> "TargetingRules":
        """The same ads with only the given categories' constraints (the others unconstrained)."""
        keep = set(categories)
        return TargetingRules(self.schema, self.ad_ids, self.live,
                              {k: v for k, v in self.include.items() if k in keep},
                              {k: v for k, v in self.exclude.items() if k in keep})

    @classmethod
    def from_columns(cls, schema: TargetingSchema, ad_ids, live=None, include=None, exclude=None,
                     allow_free: bool = False, copy: bool = True) -> "TargetingRules":
        """Validate column arrays (see the class docstring) and build the rules without per-ad
        Python objects. Values within an ad's set are sorted and de-duplicated here (a column that
        is already canonical, as the generator writes them, is validated in one parallel pass and
        kept as is).

        Args:
            allow_free: accept ``-1`` ad ids as free slots (they must be non-live and unconstrained).
            copy: keep copies of the arrays (default), so that a caller reusing its buffers cannot
                change the rules underneath an index; ``False`` keeps canonical arrays as given
                (no second copy of a 10^8-ad pool's ~37 GB: arrays made for these rules alone, or
                the read-only memory maps of :meth:`load`).

        Raises:
            RuleError: duplicate or negative ad ids, a malformed CSR (indptr not starting at 0,
                decreasing, or not ending at len(values)), an unknown category, or a value out of
                range (the message names the first offending ad and the category).
        """
        ids = np.asarray(ad_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise RuleError("ad_ids must be a 1-D integer array")
        if ids.size and ids.dtype.kind == "u" and ids.max() > MAX_AD_ID:
            raise RuleError(f"ad {int(ids.max())}: ad_id must be in 0..2^63-1")
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.size
        free = ids == -1 if allow_free else np.zeros(n, bool)
        real = ids[~free] if allow_free else ids
        if real.size and real.min() < 0:
            raise RuleError(f"ad {int(real[real < 0][0])}: ad_id must be non-negative")
        if real.size > 1:
            srt = np.sort(real) if not np.all(real[1:] > real[:-1]) else real
            dup = srt[1:] == srt[:-1]
            if dup.any():
                raise RuleError(f"ad {int(srt[1:][dup][0])}: duplicate ad_id")
        live = np.ones(n, bool) if live is None else np.asarray(live)
        if live.shape != (n,) or live.dtype != np.bool_:
            raise RuleError(f"live must be a bool array of shape ({n},)")

        def check(csr, kind):
            out = {}
            for name, pair in (csr or {}).items():
                if not schema.has(name):
                    raise RuleError(f"{kind}: unknown category {name!r}")
                if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                    raise RuleError(f"{kind}, category {name!r}: expected an (indptr, values) pair")
                out[name] = check_csr_column(kind, name, schema[name].cardinality, pair[0], pair[1], n, ids)
            return out

        inc, exc = check(include, "include"), check(exclude, "exclude")
        if allow_free and free.any():
            if live[free].any():
                raise RuleError("a free slot (ad_id -1) must not be live")
            for csr in (inc, exc):
                for name, (ptr, _) in csr.items():
                    if np.any(np.diff(ptr)[free]):
                        raise RuleError(f"a free slot (ad_id -1) constrains category {name!r}")
        # copies: the index keeps these arrays as its source of truth for later updates, so a
        # caller reusing its buffers must not be able to change them underneath it
        if not copy:
            return cls(schema, ids, live, inc, exc)
        inc = {name: (ptr.copy(), vals.copy()) for name, (ptr, vals) in inc.items()}
        exc = {name: (ptr.copy(), vals.copy()) for name, (ptr, vals) in exc.items()}
        return cls(schema, ids.copy(), live.copy(), inc, exc)

    def save(self, path) -> None:
        """Write the rules to the directory ``path`` (created; it must not exist yet): the schema
        as JSON and each array as ``.npy``, so that :meth:`load` can memory-map them. The
        directory appears whole or not at all (written beside it, then renamed).

        Raises:
            FileExistsError: ``path`` exists.
        """
        import os
        import tempfile

        path = os.fspath(path)
        if os.path.exists(path):
            raise FileExistsError(f"{path} exists: rules are saved to a new directory")
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".rules-", dir=parent)
        try:
            cols = {"include": sorted(self.include), "exclude": sorted(self.exclude)}
            meta = {"format": _SAVED_FORMAT, "n_ads": self.n_ads, "columns": cols,
                    "schema": [[c.name, int(c.cardinality), bool(c.multi_valued)] for c in self.schema]}
            with open(os.path.join(tmp, "rules.json"), "w") as f:
                json.dump(meta, f)
            np.save(os.path.join(tmp, "ad_ids.npy"), np.ascontiguousarray(self.ad_ids, np.int64))
            np.save(os.path.join(tmp, "live.npy"), np.ascontiguousarray(self.live, np.bool_))
            for kind, csr in (("include", self.include), ("exclude", self.exclude)):
                for i, name in enumerate(cols[kind]):
                    ptr, vals = csr[name]
                    np.save(os.path.join(tmp, f"{kind}{i}.indptr.npy"), np.ascontiguousarray(ptr, np.int64))
                    np.save(os.path.join(tmp, f"{kind}{i}.values.npy"), np.ascontiguousarray(vals, np.int32))
            try:
                os.rename(tmp, path)
            except OSError as e:  # another save got there first (a non-empty directory is not replaced)
                if os.path.exists(path):
                    raise FileExistsError(f"{path} exists: rules are saved to a new directory") from e
                raise
        except BaseException:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, path, mmap: bool = True) -> "TargetingRules":
        """The rules :meth:`save` wrote to ``path``, validated as :meth:`from_columns` validates.
        ``mmap=True`` maps the arrays read-only instead of reading them: processes on one host that
        load the same rules share one copy in the page cache (a 10^8-ad pool's rules are ~37 GB).

        Raises:
            FileNotFoundError: no saved rules at ``path``; RuleError: anything that is not what
            :meth:`save` writes, the file named (an unknown format, a malformed ``rules.json``, a
            missing, truncated or unreadable array, one of the wrong shape or dtype, a file
            ``rules.json`` does not name, a malformed CSR or value, duplicate ad ids).
        """
        import os

        from .schema import Category

        path = os.fspath(path)
        try:
            with open(os.path.join(path, "rules.json")) as f:
                meta = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"no saved rules at {path} (TargetingRules.save writes rules.json there)") from None
        except (OSError, ValueError) as e:
            raise RuleError(f"{path}/rules.json: unreadable ({e})") from None
        if not isinstance(meta, dict) or meta.get("format") != _SAVED_FORMAT:
            raise RuleError(f"{path}: not rules saved by TargetingRules.save (format {_SAVED_FORMAT})")

        def whole(x):
            return isinstance(x, int) and not isinstance(x, bool)

        try:
            n, cols, cats = meta["n_ads"], meta["columns"], meta["schema"]
            ok = (whole(n) and n >= 0 and isinstance(cats, list) and isinstance(cols, dict)
                  and all(isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) and whole(c[1])
                          and isinstance(c[2], bool) for c in cats)
                  and all(isinstance(cols.get(k), list) and all(isinstance(x, str) for x in cols[k])
                          and len(set(cols[k])) == len(cols[k]) for k in ("include", "exclude")))
            if not ok:
                raise ValueError("n_ads must be a non-negative int, schema a list of [name, cardinality, "
                                 "multi_valued], columns lists of distinct names")
            schema = TargetingSchema(Category(*c) for c in cats)
        except (KeyError, TypeError, ValueError) as e:
            raise RuleError(f"{path}/rules.json: malformed ({e})") from None
        names = {"rules.json", "ad_ids.npy", "live.npy"} | {
            f"{kind}{i}.{part}.npy" for kind in ("include", "exclude") for i in range(len(cols[kind]))
            for part in ("indptr", "values")}
        stray = sorted(set(os.listdir(path)) - names)
        if stray:
            raise RuleError(f"{path}: files rules.json does not name ({', '.join(stray[:4])}): not one save's rules")

        def read(name):
            try:
                return np.load(os.path.join(path, name), mmap_mode="r" if mmap else None, allow_pickle=False)
            except (OSError, ValueError, EOFError) as e:
                raise RuleError(f"{path}/{name}: unreadable ({type(e).__name__}: {e})") from None

        def array(name, dtype, shape):
            a = read(name)
            if a.dtype != dtype or a.shape != shape:
                raise RuleError(f"{path}/{name}: expected {np.dtype(dtype)} of shape {shape}, got {a.dtype} of "
                                f"shape {a.shape}")
            return a

        csr = {kind: {name: (array(f"{kind}{i}.indptr.npy", np.int64, (n + 1,)), read(f"{kind}{i}.values.npy"))
                      for i, name in enumerate(names_)} for kind, names_ in cols.items() if kind in ("include", "exclude")}
        ids, live = array("ad_ids.npy", np.int64, (n,)), array("live.npy", np.bool_, (n,))
        return cls.from_columns(schema, ids, live, csr["include"], csr["exclude"], allow_free=True, copy=False)

    @classmethod
    def from_records(cls, schema: TargetingSchema, records: Iterable[Mapping]) -> "TargetingRules":
        """Validate rule records (the module docstring's format) and keep them in the given order.

        Raises:
            RuleError: a record that is not a mapping, a missing / non-integer / negative /
                duplicate ``ad_id``, an unknown field or category, a value that is not an integer
                or is out of range, ``live`` that is not a bool. The message names the ad and the
                category.
        """
        ids, lives, cols = records_to_columns(schema, records, allowed=("ad_id", "live", "include", "exclude"))
        return cls.from_columns(schema, ids, lives, cols["include"], cols["exclude"])

    @classmethod
    def from_jsonl(cls, schema: TargetingSchema, source) -> "TargetingRules":
        """Rules from JSON lines: a path, an open text file, or an iterable of strings, one record
        (module docstring) per non-empty line.

        Raises:
            RuleError: a line that is not valid JSON (the message gives the line number), or any
                error of :meth:`from_records`.
        """
        return cls.from_records(schema, read_jsonl(source))

    def to_jsonl(self, path=None) -> str:
        """The rules as JSON lines (one record a line, sorted values); written to ``path`` if given."""
        text = "".join(json.dumps(r) + "\n" for r in self.to_records())
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    @classmethod
    def from_frame(cls, schema: TargetingSchema, frame, ad_ids=None) -> "TargetingRules":
        """Rules from a long DataFrame with columns ``ad_id, category, kind, value``
        (``kind`` is ``"include"`` or ``"exclude"``), plus optional ``live`` column.

        ``ad_ids`` fixes the slot order and lets ads without any row exist (unconstrained);
        by default the sorted distinct ad ids of the frame.
        """
        need = {"ad_id", "category", "kind", "value"}
        missing = need - set(frame.columns)
        if missing:
            raise RuleError(f"rule frame lacks columns {sorted(missing)}")
        bad_kind = set(frame["kind"]) - {"include", "exclude"}
        if bad_kind:
            raise RuleError(f"rule frame: kind must be 'include' or 'exclude', got {sorted(bad_kind)}")
        frame_ids = [_ad_id(a, f"rule frame row {i}") for i, a in enumerate(frame["ad_id"])]
        order = sorted(set(frame_ids)) if ad_ids is None else [_ad_id(a, "ad_ids") for a in ad_ids]
        recs = {a: {"ad_id": a, "include": {}, "exclude": {}} for a in order}
        if len(recs) != len(order):
            raise RuleError("ad_ids holds duplicates")
        for i, (a, cat, kind, v) in enumerate(zip(frame_ids, frame["category"], frame["kind"], frame["value"])):
            if a not in recs:
                raise RuleError(f"ad {a}: not in ad_ids")
            if isinstance(v, (float, np.floating)) and np.isnan(v):
                raise RuleError(f"ad {a}, category {cat!r}: rule frame row {i} has no value (NaN)")
            recs[a][kind].setdefault(cat, []).append(v)
        if "live" in frame.columns:
            for i, (a, live) in enumerate(zip(frame_ids, frame["live"])):
                if not isinstance(live, (bool, np.bool_)):
                    raise RuleError(f"ad {a}: live must be a bool, got {live!r} (rule frame row {i})")
                if recs[a].get("live", bool(live)) != bool(live):
                    raise RuleError(f"ad {a}: rows disagree on live (rule frame row {i})")
                recs[a]["live"] = bool(live)
        return cls.from_records(schema, recs.values())

    def to_records(self) -> list[dict]:
        """The rules as JSON-ready records (sorted value lists)."""
        return [
            {
                "ad_id": r.ad_id,
                "live": r.live,
                "include": {c: sorted(s) for c, s in r.include.items()},
                "exclude": {c: sorted(s) for c, s in r.exclude.items()},
            }
            for r in self.rules
        ]


def read_jsonl(source) -> list:
    """Records from a path (str or os.PathLike), an open text file, a string holding the lines,
    or an iterable of lines."""
    import os

    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                           and not source.lstrip().startswith("{")):
        with open(source) as f:
            lines = f.read().splitlines()
    elif hasattr(source, "read"):
        lines = source.read().splitlines()
    elif isinstance(source, str):
        lines = source.splitlines()
    else:
        lines = list(source)
    out = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise RuleError(f"line {no}: not valid JSON ({exc.msg})") from None
    return out


def _ad_id(value, where: str) -> int:
    """``value`` as an ad id: an integer (not a bool, not a float) in ``0..MAX_AD_ID``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_AD_ID:
        raise RuleError(f"{where}: ad_id must be an integer in 0..2^63-1, got {value!r}")
    return int(value)


def records_to_columns(schema, records, allowed):
    """Validate rule records into (ids, lives, {kind: {cat: (ptr, vals)}}) without de-duplicating ids."""
    ids, lives = [], []
    lists = {"include": {c.name: [] for c in schema}, "exclude": {c.name: [] for c in schema}}
    seen = set()
    check_dup = "op" not in allowed
    if isinstance(records, Mapping):  # one record, not a list of them (its keys would read as records)
        raise RuleError("records must be a sequence of mappings, got one mapping: wrap it in a list")
    for pos, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise RuleError(f"record {pos}: expected a mapping, got {type(rec).__name__}")
        extra = set(rec) - set(allowed)
        if extra:
            raise RuleError(f"record {pos}: unknown fields {sorted(extra)}")
        ad_id = _ad_id(rec.get("ad_id"), f"record {pos}")
        if check_dup:
            if ad_id in seen:
                raise RuleError(f"ad {ad_id}: duplicate ad_id")
            seen.add(ad_id)
        live = rec.get("live", True)
        if not isinstance(live, (bool, np.bool_)):
            raise RuleError(f"ad {ad_id}: live must be a bool, got {live!r}")
        for kind in ("include", "exclude"):
            part = rec.get(kind)
            part = {} if part is None else part
            if not isinstance(part, Mapping):
                raise RuleError(f"ad {ad_id}: {kind} must map category -> values, got {part!r}")
            sets = {cat: value_set(schema, f"ad {ad_id} ({kind})", cat, vals) for cat, vals in part.items()}
            for cat in lists[kind]:
                lists[kind][cat].append(sorted(sets.get(cat, ())))
        ids.append(ad_id)
        lives.append(bool(live))

    def csr(per_ad):
        ptr = np.zeros(len(per_ad) + 1, np.int64)
        np.cumsum([len(v) for v in per_ad], out=ptr[1:])
        vals = np.fromiter((v for vs in per_ad for v in vs), dtype=np.int32, count=int(ptr[-1]))
        return ptr, vals

    cols = {kind: {cat: csr(v) for cat, v in d.items() if any(v)} for kind, d in lists.items()}
    return np.array(ids, np.int64), np.array(lives, bool), cols

