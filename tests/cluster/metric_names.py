"""The metric names and label sets a process serves, from its /metrics text."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",), "info": ("_info",), "summary": ("_sum", "_count", "_created"), "unknown": ("",)}


async def scrape(port: int) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        assert response.status == 200
        return await response.text()


def served(*texts: str) -> dict[str, list[dict[str, str]]]:
    """Every sample name the processes serve (with each family's suffixes), and the label sets seen."""
    found: dict[str, list[dict[str, str]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for suffix in SUFFIXES.get(family.type, ("",)):
                found.setdefault(family.name + suffix, [])
            for sample in family.samples:
                found.setdefault(sample.name, []).append(dict(sample.labels))
    return found
