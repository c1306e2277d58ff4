"""The host report's verdict: each measured figure beside what it should be, and the shortfalls.

A shortfall is a card under HOST_MIN_GPU_FRACTION of its datasheet matmul figure, held back by a
thermal or power throttle, a PCIe link narrower than the card's, a host→device copy under
HOST_MIN_COPY_GBPS, a WORKDIR disk writing under HOST_MIN_DISK_MBPS, or a card other than the one the
provider says it rented. Fewer CPU cores per GPU than the data loaders want is said, never judged:
it slows training without making the machine wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import datasheet

CPUS_PER_GPU = 4  # libreyolo's loaders (workers=4..8 per process) starve below this


@dataclass(frozen=True)
class Floors:
    gpu_fraction: float
    copy_gbps: float
    disk_mbps: float


def _figure(measured: Any, expected: float | None = None, floor: float | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"measured": measured}
    if expected is not None:
        entry["expected"] = expected
    if floor is not None:
        entry["floor"] = round(floor, 1)
    return entry


def _family(name: str | None) -> str | None:
    card = datasheet.lookup(name)
    return card.match[0] if card is not None else None


def _words(name: str) -> list[str]:
    return [word for word in re.split(r"[\s_\-]+", name.lower()) if word and word not in {"nvidia", "geforce"}]


def same_card(said: str, seen: str) -> bool:
    """The provider's GPU type against the card's own name: the same family when both are in the
    datasheet table (memory size and form factor are not always in the provider's words), else
    every word the provider used appears in the card's name."""
    families = _family(said), _family(seen)
    if None not in families:
        return families[0] == families[1]
    seen_words = " ".join(_words(seen))
    return all(word in seen_words for word in _words(said))


def gpu_figures(gpu: Mapping[str, Any], link: Mapping[str, Any], floors: Floors) -> tuple[dict[str, Any], list[str]]:
    """One card's entry in the report, and its shortfalls."""
    name = str(gpu.get("name") or f"GPU {gpu.get('index')}")
    card = datasheet.lookup(name)
    bench = gpu.get("bench") or {}
    entry: dict[str, Any] = {"index": gpu.get("index"), "name": name, "memory_gib": gpu.get("total_gib")}
    short: list[str] = []
    label = f"GPU {gpu.get('index')} ({name})"
    if card is not None:
        entry["datasheet"] = {"card": card.name, "source": card.source}
    for key in ("bf16_tflops", "fp16_tflops"):
        expected = getattr(card, key) if card is not None else None
        floor = expected * floors.gpu_fraction if expected is not None else None
        entry[key] = _figure(bench.get(key), expected, floor)
        measured = bench.get(key)
        if floor is not None and isinstance(measured, int | float) and measured < floor:
            short.append(
                f"{label}: {key.split('_')[0]} matmul {measured:.0f} TFLOP/s, under {floors.gpu_fraction:.0%} of"
                f" the {card.name if card else ''} datasheet's {expected:.0f} (dense)"
            )
    copy = bench.get("copy_gbps")
    entry["copy_gbps"] = _figure(copy, floor=floors.copy_gbps)
    if isinstance(copy, int | float) and copy < floors.copy_gbps:
        short.append(f"{label}: host→device copy {copy:.1f} GB/s, under HOST_MIN_COPY_GBPS={floors.copy_gbps:g}")
    if link:
        entry["pcie"] = {
            "current": f"gen{link.get('gen')} x{link.get('width')}",
            "max": f"gen{link.get('gen_max')} x{link.get('width_max')}",
        }
        if card is not None:
            entry["pcie"]["expected"] = f"gen{card.pcie_gen} x{card.pcie_width}"
        width, widest = link.get("width"), link.get("width_max")
        if isinstance(width, int) and isinstance(widest, int) and width < widest:
            short.append(f"{label}: PCIe link x{width}, the card can do x{widest} (a riser or a narrow slot)")
        throttle = link.get("throttle") or []
        entry["throttle"] = throttle
        if throttle:
            short.append(f"{label}: clocks held back ({', '.join(throttle)})")
    return entry, short


def judge(
    gpu_details: Mapping[str, Any],
    host: Mapping[str, Any],
    provider: Mapping[str, Any] | None,
    floors: Floors,
) -> dict[str, Any]:
    """The whole report: ``gpus``, the host's figures, ``provider``, ``shortfalls`` and ``notes``."""
    shortfalls: list[str] = []
    notes: list[str] = []
    links = {int(k): v for k, v in (gpu_details.get("links") or {}).items() if str(k).isdigit()}
    gpus = []
    for gpu in gpu_details.get("gpus") or []:
        if not gpu.get("name"):
            continue
        entry, short = gpu_figures(gpu, links.get(int(gpu.get("index", -1)), {}), floors)
        gpus.append(entry)
        shortfalls += short
    report: dict[str, Any] = {"gpus": gpus}
    count = max(len(gpus), 1)
    cores = host.get("cpu_cores")
    report["cpu_cores"] = {"measured": cores, "per_gpu": round(cores / count, 1) if cores else None}
    report["cpu_cores"]["expected_per_gpu"] = CPUS_PER_GPU
    if gpus and isinstance(cores, int | float) and cores / count < CPUS_PER_GPU:
        notes.append(f"{cores:g} CPU cores for {count} GPU(s): the data loaders may keep the cards waiting")
    report["ram_gib"] = host.get("ram_gib")
    report["shm_gib"] = host.get("shm_gib")
    disk = dict(host.get("disk") or {})
    write = disk.get("write_mbps")
    report["disk"] = {
        "path": disk.get("path"),
        "write_mbps": _figure(write, floor=floors.disk_mbps),
        "read_mbps": _figure(disk.get("read_mbps"), floor=floors.disk_mbps),
        **({"error": disk["error"]} if "error" in disk else {}),
    }
    if isinstance(write, int | float) and write < floors.disk_mbps:
        shortfalls.append(
            f"WORKDIR disk writes {write:.0f} MB/s, under HOST_MIN_DISK_MBPS={floors.disk_mbps:g}"
            " (the dataset and every checkpoint go through it)"
        )
    read = disk.get("read_mbps")
    if isinstance(read, int | float) and read < floors.disk_mbps:
        shortfalls.append(f"WORKDIR disk reads {read:.0f} MB/s, under HOST_MIN_DISK_MBPS={floors.disk_mbps:g}")
    if provider and provider.get("gpu_name"):
        said = str(provider["gpu_name"])
        seen = sorted({entry["name"] for entry in gpus})
        matches = bool(seen) and all(same_card(said, name) for name in seen)
        report["provider"] = {**provider, "seen": seen, "match": matches}
        if seen and not matches:
            shortfalls.append(
                f"{provider.get('source', 'the provider')} says this instance has {said!r}, nvidia-smi sees"
                f" {', '.join(seen)}"
            )
        said_count = provider.get("gpu_count")
        if isinstance(said_count, int) and gpus and said_count > len(gpu_details.get("cards") or gpus):
            shortfalls.append(f"the provider rented {said_count} GPUs, this container sees {len(gpus)}")
    report["shortfalls"] = shortfalls
    report["notes"] = notes
    return report


def brief(report: Mapping[str, Any]) -> str:
    """One phrase for the receipt: the GPUs' bf16 against the datasheet, the disk, the shortfalls."""
    parts = []
    for gpu in report.get("gpus") or []:
        figure = gpu.get("bf16_tflops") or {}
        if figure.get("measured") is not None:
            expected = f"/{figure['expected']:g}" if figure.get("expected") else ""
            parts.append(f"GPU {gpu.get('index')} bf16 {figure['measured']:g}{expected} TFLOP/s")
    write = ((report.get("disk") or {}).get("write_mbps") or {}).get("measured")
    if write is not None:
        parts.append(f"disk {write:g} MB/s")
    count = len(report.get("shortfalls") or [])
    parts.append(f"{count} shortfall{'s' if count != 1 else ''}" if count else "as expected")
    return ", ".join(parts)


def lines(report: Mapping[str, Any]) -> list[str]:
    """The report for people: one line per GPU and one for the host, then the shortfalls."""
    out = []
    for gpu in report.get("gpus") or []:
        parts = []
        for key in ("bf16_tflops", "fp16_tflops"):
            figure = gpu.get(key) or {}
            if figure.get("measured") is not None:
                expected = f" of {figure['expected']:g}" if figure.get("expected") else ""
                parts.append(f"{key.split('_')[0]} {figure['measured']:g}{expected} TFLOP/s")
        copy = (gpu.get("copy_gbps") or {}).get("measured")
        if copy is not None:
            parts.append(f"copy {copy:g} GB/s")
        if gpu.get("pcie"):
            parts.append(f"PCIe {gpu['pcie']['current']} (max {gpu['pcie']['max']})")
        out.append(f"host: GPU {gpu.get('index')} {gpu.get('name')}: {', '.join(parts) or 'no figures'}")
    disk = report.get("disk") or {}
    write = (disk.get("write_mbps") or {}).get("measured")
    read = (disk.get("read_mbps") or {}).get("measured")
    cores = report.get("cpu_cores") or {}
    out.append(
        f"host: disk write {write} MB/s, read {read} MB/s; RAM {report.get('ram_gib')} GiB;"
        f" {cores.get('measured')} CPU cores ({cores.get('per_gpu')} per GPU); /dev/shm {report.get('shm_gib')} GiB"
    )
    if report.get("dataset_mbps") is not None:
        out.append(f"host: dataset download {report['dataset_mbps']} MB/s")
    out += [f"host: {note}" for note in report.get("notes") or []]
    out += [f"host shortfall: {line}" for line in report.get("shortfalls") or []]
    return out
