"""Where Pool.apply's wall time goes on the GPU host (a session's diagnostic, not committed)."""
import os, sys, time, cProfile, pstats, io
import numpy as np
from andromeda_nb.bench.targeting_world import World, UpdateStream
from andromeda_nb.bench.tables import gpu_table
from andromeda_nb.pipeline import Pool, PoolUpdate
from andromeda_nb.targeting import RETIRE
from andromeda_nb.device import launch
N = int(sys.argv[1]); OUT = sys.argv[2]
cuda = launch.cuda()
t = time.time(); w = World(N, host_bits="auto"); print("world", time.time() - t, flush=True)
if launch.backend.is_simulator():
    from andromeda_nb.model import AdTable
    table = AdTable.from_float(np.random.default_rng(1).standard_normal((N, 64)) * 0.5, np.zeros(N), dtype="fp16", ad_ids=w.index.ad_ids[:N])
else:
    table = gpu_table(N, 64, "fp16", "rows", seed=1)
pool = Pool(table, w.dev, max_batch=4, max_k=1000)
stream = UpdateStream(w, seed=23)
rng = np.random.default_rng(1)
def update(size):
    batch = stream.batch(size)
    emb = (rng.standard_normal((size, 64)) * 0.5).astype(np.float32)
    return PoolUpdate(batch, emb, rng.standard_normal(size).astype(np.float32), batch.ops != RETIRE).checked()
pool.apply(update(1000)); cuda.synchronize(); print("grown", pool.n_ads, flush=True)
for size in (int(x) for x in os.environ.get('SIZES', '1000,10000').split(',')):
    made = [update(size) for _ in range(16)]
    for b in made[:2]: pool.apply(b)
    cuda.synchronize()
    walls, syncs = [], []
    for b in made[2:8]:
        t0 = time.perf_counter(); pool.apply(b); t1 = time.perf_counter(); cuda.synchronize(); t2 = time.perf_counter()
        walls.append(t2 - t0); syncs.append(t2 - t1)
    print(size, "wall ms", [round(x * 1e3, 2) for x in walls], "sync ms", [round(x * 1e3, 2) for x in syncs], flush=True)
    pr = cProfile.Profile(); pr.enable()
    for b in made[8:]:
        pool.apply(b); cuda.synchronize()
    pr.disable()
    for key in ("tottime", "cumulative"):
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats(key).print_stats(45)
        open(f"{OUT}/apply_profile_{size}_{key}.txt", "w").write(s.getvalue())
        print(s.getvalue()[:6000] if key == "tottime" else "", flush=True)
