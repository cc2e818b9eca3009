"""The pool bench's soak (updates interleaved with requests, checked at checkpoints) on a tiny
world in the simulator: its checks pass on a correct pool and catch a table that stopped following
the updates."""

import numpy as np
import pytest

import andromeda_nb as anb
from andromeda_nb.bench import harness
from andromeda_nb.bench import live_pool as L
from andromeda_nb.bench import pipeline as P
from andromeda_nb.pipeline import Pool


def _world():
    from andromeda_nb.bench.targeting_world import World
    from andromeda_nb.model import Request

    world = World(600, profiles=8, host_bits="auto")  # as the pool bench: the device works out the bits
    rng = np.random.default_rng(3)
    table = anb.AdTable.from_float(rng.standard_normal((600, P.D)), rng.standard_normal(600), dtype="fp16",
                                   ad_ids=world.rules.ad_ids)
    reqs = [Request.random(P.D, P.E, P.KE, rng) for _ in range(4)]
    profiles = [dict(p) for p in world.profiles[:4]]
    return world, table, reqs, profiles


@pytest.fixture
def soak_world():
    made = _world()
    yield made
    made[0].free()


def _soak(world, table, reqs, profiles, pool):
    env = {c: "" for c in harness.SCHEMA}
    ceil = harness.Ceilings(1.0, 1.0, 1.0)
    return L._soak_rows(env, ceil, world, pool, reqs, profiles, 600, updates=240, batch=60, requests=16,
                        request_batch=4, checkpoints=2, k=8, templates=200)


@pytest.mark.slow
def test_soak_checks_pass_on_a_live_pool(soak_world):
    """The soak's checks on a pool the creates grow (the bench's own soak world has spare slots)."""
    world, table, reqs, profiles = soak_world
    pool = Pool(table, world.dev, max_batch=4, max_k=8, config=anb.KernelConfig(math="fp32"))
    row = _soak(world, table, reqs, profiles, pool)
    assert row["variant"] == "soak" and row["suite"] == "pool"
    assert row["verified"].startswith("ok: 2/2 checkpoints"), row["verified"]
    assert pool.n_ads > 600  # the creates grew the pool once


@pytest.mark.slow
def test_the_soak_run_builds_a_pool_with_spare_slots():
    """The bench's own soak world: spare slots (no growth), a pool from a host table, its sizes."""
    env = {c: "" for c in harness.SCHEMA}
    row = L._soak_run(env, harness.Ceilings(1.0, 1.0, 1.0), 500, updates=120, batch=60, requests=8, request_batch=4,
                      checkpoints=2, k=8)
    assert row["verified"].startswith("ok: 2/2 checkpoints"), row["verified"]
    assert "pool 500 -> 620 slots" in row["notes"] and "stopped" not in row["notes"]


@pytest.mark.slow
def test_soak_finds_a_table_that_missed_an_update(soak_world, monkeypatch):
    world, table, reqs, profiles = soak_world
    pool = Pool(table, world.dev, max_batch=4, max_k=8, config=anb.KernelConfig(math="fp32"))
    follow = L._HostMirror.follow
    calls = []

    def one_row_off(self, update, slots):  # after the first batch the mirror expects a row never written
        follow(self, update, slots)
        if not calls:
            self.words[slots[0], 0] ^= np.uint64(1)
        calls.append(1)

    monkeypatch.setattr(L._HostMirror, "follow", one_row_off)
    env = {c: "" for c in harness.SCHEMA}
    row = L._soak_rows(env, harness.Ceilings(1.0, 1.0, 1.0), world, pool, reqs, profiles, 600, updates=240,
                       batch=60, requests=16, request_batch=4, checkpoints=2, k=8, templates=200, seconds=0)
    assert row["verified"].startswith("FAILED") and "table != mirror: rows differ" in row["verified"]
    assert "stopped at the 0 s budget after 120 of 240 updates" in row["notes"]  # the time budget ends a run


@pytest.mark.slow
def test_requests_during_updates_rows(soak_world):
    """The during phase on a tiny world: two rows, the answers checked after the updates, the
    update rate it reached stated."""
    world, table, reqs, profiles = soak_world
    pool = Pool(table, world.dev, max_batch=4, max_k=8)
    env = {c: "" for c in harness.SCHEMA}
    rows = L._during_rows(env, harness.Ceilings(1.0, 1.0, 1.0), world, pool, reqs, profiles, 600, rate=1e6,
                          calls=4, batch=30, k=8)
    assert [r["variant"] for r in rows] == ["retrieve_alone", "retrieve_during_updates"]
    assert all(r["verified"].startswith("ok") for r in rows), rows[0]["verified"]
    assert "applied" in rows[1]["notes"] and pool.n_ads > 600


@pytest.mark.slow
def test_apply_rows(soak_world, tmp_path):
    """The apply phase on a tiny world: end to end and device rows for each batch size, in order,
    verified (index = rebuild, table ids = index ids, sampled requests)."""
    world, table, reqs, profiles = soak_world
    pool = Pool(table, world.dev, max_batch=4, max_k=1000, config=anb.KernelConfig(math="fp32"))
    env = {c: "" for c in harness.SCHEMA}
    rows = L._apply_rows(env, harness.Ceilings(1.0, 1.0, 1.0), world, pool, reqs, profiles, tmp_path,
                         batches=((20, 2), (40, 2)), busy=lambda ms: None)  # the simulator runs no busy kernel
    assert [(r["variant"], r["batch"]) for r in rows] == [("apply_end_to_end", 20), ("apply_device", 20),
                                                          ("apply_end_to_end", 40), ("apply_device", 40)]
    assert all(r["suite"] == "pool" and r["verified"].startswith("ok: index (device rows and lists, host rules) = rebuild")
               for r in rows), rows[0]["verified"]
    # where the host time goes, by own and by cumulative time: a section a size in one file
    sections = (tmp_path / "host_profiles.txt").read_text().split("=== ")[1:]
    assert [s.split(" ", 1)[0].rsplit("_", 1)[1] for s in sections] == ["20", "40"]
    assert all(s.startswith("apply_") and s.count("Ordered by") == 2 for s in sections)


@pytest.mark.slow
def test_a_pool_too_large_to_rebuild_is_checked_by_sampling(soak_world, tmp_path, monkeypatch):
    """Above REBUILD_MAX_SLOTS the apply and during phases check each sampled request against the
    top-k over the device's own match and that match against the oracle on sampled slots (no
    rebuild); the check fails when the oracle disagrees on one slot."""
    from andromeda_nb import reference

    world, table, reqs, profiles = soak_world
    monkeypatch.setattr(L, "REBUILD_MAX_SLOTS", 100)
    monkeypatch.setattr(L, "_index_vs_rebuild", lambda pool: pytest.fail("no rebuild above REBUILD_MAX_SLOTS"))
    pool = Pool(table, world.dev, max_batch=4, max_k=1000, config=anb.KernelConfig(math="fp32"))
    env = {c: "" for c in harness.SCHEMA}
    rows = L._apply_rows(env, harness.Ceilings(1.0, 1.0, 1.0), world, pool, reqs, profiles, tmp_path,
                         batches=((20, 2),), busy=lambda ms: None)
    assert rows[0]["verified"] == ("ok: table ids = index ids; ok: 3/3 sampled requests equal the reference over the "
                                   f"device's match (top-k of the kernel's scores), the match = the oracle on "
                                   f"{pool.n_ads:,} sampled slots"), rows[0]["verified"]
    assert "spare slots" in rows[0]["notes"]
    match = reference.match

    def one_off(rules, profile):  # the oracle disagrees on one slot
        out = match(rules, profile)
        out[0] = not out[0]
        return out

    monkeypatch.setattr(reference, "match", one_off)
    world, table, reqs, profiles = _world()  # a phase's own world, as the bench builds (its ads as they were)
    pool = Pool(table, world.dev, max_batch=4, max_k=8)
    rows = L._during_rows(env, harness.Ceilings(1.0, 1.0, 1.0), world, pool, reqs, profiles, 600, rate=1e6,
                          calls=2, batch=30, k=8)
    world.free()
    assert rows[0]["verified"].startswith("FAILED: 0/1 sampled requests"), rows[0]["verified"]
    assert "differs from the oracle at 1 of" in rows[0]["verified"]
