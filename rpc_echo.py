import time, numpy as np
from distributed import Client, LocalCluster
class Echo:
    def call(self, x):
        return x
def register(dask_worker):
    async def echo(comm=None, x=None):
        return x
    dask_worker.handlers["anb_echo"] = echo
if __name__ == "__main__":
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = Client(cluster, direct_to_workers=True)
    a = client.submit(Echo, actor=True).result()
    x = {"V": np.random.rand(6, 64).astype(np.float32), "ids": np.arange(1000), "s": np.random.rand(1000).astype(np.float32)}
    for _ in range(20): a.call(x).result()
    ts=[]
    for _ in range(200):
        t=time.perf_counter(); a.call(x).result(); ts.append(time.perf_counter()-t)
    print("actor ms", np.median(ts)*1e3, np.percentile(ts,99)*1e3)
    addr = list(client.scheduler_info()["workers"])[0]
    client.run(register)
    async def call_rpc(x):
        return await client.rpc(addr).anb_echo(x=x)
    for _ in range(20): client.sync(call_rpc, x)
    ts=[]
    for _ in range(200):
        t=time.perf_counter(); client.sync(call_rpc, x); ts.append(time.perf_counter()-t)
    print("rpc ms", np.median(ts)*1e3, np.percentile(ts,99)*1e3)
    client.close(); cluster.close()
