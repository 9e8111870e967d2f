"""The benchmark's table: one row per configuration, its speedups and its share of the
machine's ceilings, as Markdown and as a chart."""

import json
import statistics

from tfdp.util import charts

EPOCH_EXAMPLES = 60000


def summarise(configs, samples, ceilings, flops_per_example) -> list:
    """One row per configuration. ``ceilings``: matmul GFLOP/s by dtype name. ``vs_plain``
    compares with the fastest plain fit of the row's precision; ``vs_fp32``, with the same
    configuration in float32."""
    rows = []
    for config in configs:
        rates = samples[config["name"]]
        median = statistics.median(rates)
        row = {**config, "examples_per_sec": median, "min": min(rates), "max": max(rates),
               "runs": len(rates), "sec_per_epoch": EPOCH_EXAMPLES / median}
        for dtype, gflops in ceilings.items():
            row[f"of_{dtype}_ceiling"] = flops_per_example * median / (gflops * 1e9)
        row["flops_fraction"] = row[f"of_{config['precision']}_ceiling"]
        rows.append(row)

    def alike(r, row, *keys):
        return all(r[key] == row[key] for key in keys)

    for row in rows:
        one = next((r for r in rows if r["path"] == row["path"] and r["devices"] == 1
                    and r["allreduce"] in (row["allreduce"], "add_n", "-")
                    and alike(r, row, "eager", "jit", "spe", "precision", "intra", "inter",
                              "backup")), None)
        row["speedup"] = row["examples_per_sec"] / one["examples_per_sec"] if one else None
        row["efficiency"] = row["speedup"] / row["devices"] if one else None
        plain = [r for r in rows if r["path"] == "plain" and r["precision"] == row["precision"]]
        best = max(plain, key=lambda r: r["examples_per_sec"], default=None)
        row["vs_plain"] = row["examples_per_sec"] / best["examples_per_sec"] if best else None
        stock = next((r for r in rows if r["path"] == "stock"), None)
        row["vs_stock"] = row["examples_per_sec"] / stock["examples_per_sec"] if stock else None
        fp32 = next((r for r in rows if r["precision"] == "float32" and alike(
            r, row, "path", "devices", "allreduce", "eager", "jit", "spe", "intra", "inter",
            "backup")), None)
        row["vs_fp32"] = (row["examples_per_sec"] / fp32["examples_per_sec"]
                          if fp32 and row["precision"] != "float32" else None)
    return rows


def format_table(rows, ceilings, flops_per_example, settings) -> str:
    def opt(value, fmt):
        return format(value, fmt) if value is not None else "-"

    lines = [f"{settings.model}, global batch {settings.batch_size}, {settings.data} data, "
             f"{settings.steps} steps x {settings.epochs - 1} timed epochs x {settings.rounds} rounds; "
             f"matmul ceilings {ceilings['float32']:.0f} GFLOP/s fp32, "
             f"{ceilings['bfloat16']:.0f} bf16; {flops_per_example / 1e6:.1f} MFLOP per "
             "training example; vs plain fit: the fastest plain row of the same precision",
             "| config | path | devices | allreduce | precision | step | threads | "
             "examples/s (min-max) | sec/epoch | speedup vs 1 | efficiency | vs fp32 | "
             "vs plain fit | vs stock fit | of fp32 ceiling | of bf16 ceiling |",
             "|" + " --- |" * 16]
    for r in rows:
        step = "eager" if r["eager"] else ("compiled" if r["spe"] == 1 else
                                           f"compiled, {r['spe']} steps/call")
        step += ", XLA" * r.get("jit", False)
        step += f", backup every {r['backup']}" if r.get("backup") is not None else ""
        threads = (f"{r['intra'] or 'tfdp'} intra, {r['inter'] or 'tfdp'} inter"
                   if r["intra"] or r["inter"] else "tfdp's")
        precision = "bf16" if r["precision"] == "bfloat16" else "fp32"
        lines.append(
            f"| {r['name']} | {r['path']} | {r['devices']} | {r['allreduce']} | {precision} | "
            f"{step} | {threads} | "
            f"{r['examples_per_sec']:.0f} ({r['min']:.0f}-{r['max']:.0f}) | "
            f"{r['sec_per_epoch']:.1f} | {opt(r['speedup'], '.2f')} | "
            f"{opt(r['efficiency'], '.0%')} | {opt(r['vs_fp32'], '.2f')} | "
            f"{opt(r['vs_plain'], '.2f')} | {opt(r['vs_stock'], '.2f')} | "
            f"{r['of_float32_ceiling']:.1%} | {r['of_bfloat16_ceiling']:.1%} |")
    return "\n".join(lines)


def format_allreduce(result) -> str:
    lines = [f"allreduce, best of 5; memcpy {result['memcpy_gbps']:.1f} GB/s",
             "| algorithm | k | size | time | bus bandwidth |", "| --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        size = (f"{r['bytes'] >> 20} MB" if r["bytes"] >= 1 << 20 else f"{r['bytes'] >> 10} KB")
        if "error" in r:
            lines.append(f"| {r['algorithm']} | {r['k']} | {size} | n/a: {r['error']} | |")
        else:
            lines.append(f"| {r['algorithm']} | {r['k']} | {size} | "
                         f"{r['seconds'] * 1e3:.2f} ms | {r['bus_gbps']:.2f} GB/s |")
    return "\n".join(lines)


def plot(rows, path, settings):
    fig = charts.figure(7, 0.5 * len(rows) + 1.5)
    ax = fig.subplots()
    names = [r["name"] for r in rows]
    ax.barh(names, [r["examples_per_sec"] for r in rows],
            xerr=[[r["examples_per_sec"] - r["min"] for r in rows],
                  [r["max"] - r["examples_per_sec"] for r in rows]], color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("training examples / s (median, min-max)")
    ax.set_title(f"{settings.model}, batch {settings.batch_size}, {settings.data} data")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_table(base: str, rows, table: str) -> None:
    """``base``.json with ``rows`` and ``base``.md with ``table``."""
    with open(base + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(table + "\n")
