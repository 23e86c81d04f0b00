"""The /metrics endpoint shows what the oracle did."""

from __future__ import annotations

import asyncio
import urllib.request

import tsoracle


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("tsoracle_"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def test_metrics_endpoint_counts_operations_batches_and_failures(url):
    port = tsoracle.serve_metrics(0)
    await tsoracle.init(url, timelines=["counter:m"])
    before = scrape(port)
    key = 'tsoracle_operations_succeeded_total{implementation="distributed",operation="read_ts"}'
    async with tsoracle.connect(url, timeline="counter:m") as o:
        await asyncio.gather(*[o.read_ts() for _ in range(100)])
        await tsoracle.flip(url, to="legacy")
        try:
            await o.write_ts()
        except tsoracle.Fenced:
            pass
    after = scrape(port)
    assert after[key] - before.get(key, 0) == 100
    failed = ('tsoracle_operations_failed_total{error="Fenced",implementation="distributed",'
              'operation="write_ts"}')
    assert after[failed] - before.get(failed, 0) == 1
    batches = 'tsoracle_batch_size_count{implementation="distributed",operation="read_ts"}'
    assert 1 <= after[batches] - before.get(batches, 0) < 100
    assert 'tsoracle_epoch{timeline="counter:m"}' in after
