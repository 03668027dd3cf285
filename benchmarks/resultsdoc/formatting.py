"""How figures are printed in the document: thousands separators, percentages, ratios, memory units."""


def n0(x: float) -> str:
    return f"{x:,.0f}"


def k1(x: float) -> str:
    """Tokens/s in thousands, one decimal: 72,266 -> 72.3k."""
    return f"{x / 1000:.1f}k"


def pct(x: float, digits: int = 1) -> str:
    text = f"{100 * x:.{digits}f}"
    return f"{'0' if float(text) == 0 else text} %"  # no "-0.0"


def gain(new: float, old: float, digits: int = 1) -> str:
    """new against old as a signed percentage: +5.5 %."""
    return f"{100 * (new / old - 1):+.{digits}f} %"


def ratio(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}×"


def mem(x: float, unit: str) -> str:
    return f"{x:.1f} {unit}"


def sci(x: float, digits: int = 2) -> str:
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


# Peak memory: kaiyuan's metrics (and so train_report.py, train_throughput.py's Megatron rows and zero_stages.py)
# wrote max_memory_allocated / 2**30 under "peak_mem_gb" before rev 46ff3c1 and / 1e9 from it on. Each entry
# says which its file holds (the unit each topic function passes to mem).
GIB, GB = "GiB", "GB"
