"""DiscoveryWorld results in the shape of its paper's Tables 4 and 5 (docs/games.md): a cell
averages the seeds played, an Average row the rows, as the paper's does."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rose_ray.envs.discoveryworld.catalogue import DIFFICULTIES, THEMES, DiscoveryWorldCatalogue

METRICS = ("completion", "process", "knowledge")


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def cell(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Completion, process and knowledge (None without a judged game) over some game records."""
    known = [r["knowledge"] for r in rows if r.get("knowledge") is not None]
    return {"games": len(rows), "completion": _mean([float(bool(r["success"])) for r in rows]),
            "process": _mean([float(r["process"]) for r in rows]), "knowledge": _mean(known),
            "knowledge_games": len(known)}


def _average(cells: list[dict[str, Any]]) -> dict[str, Any]:
    return {"games": sum(c["games"] for c in cells),
            "knowledge_games": sum(c["knowledge_games"] for c in cells),
            **{m: _mean([c[m] for c in cells if c[m] is not None]) for m in METRICS}}


def paper_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """{"themes": {theme: {difficulty: cell}}, "theme_average": {difficulty: cell},
    "unit_tests": {name: cell}, "unit_test_average": cell | None, "tutorial": cell | None}."""
    catalogue = DiscoveryWorldCatalogue()
    themes: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    units: dict[str, list] = defaultdict(list)
    tutorial: list = []
    for r in records:
        s = catalogue.scenario(catalogue.game(r["item_id"]))
        if s.kind == "theme":
            themes[s.name][s.difficulty].append(r)
        elif s.kind == "unit test":
            units[s.short_name].append(r)
        else:
            tutorial.append(r)
    theme_cells = {t: {d: cell(themes[t][d]) for d in DIFFICULTIES if themes[t][d]} for t in THEMES if t in themes}
    unit_cells = {u: cell(rs) for u, rs in units.items()}
    return {
        "themes": theme_cells,
        "theme_average": {d: _average([c[d] for c in theme_cells.values() if d in c])
                          for d in DIFFICULTIES if any(d in c for c in theme_cells.values())},
        "unit_tests": unit_cells,
        "unit_test_average": _average(list(unit_cells.values())) if unit_cells else None,
        "tutorial": cell(tutorial) if tutorial else None,
    }


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table, its first column a name, the others numbers (right-aligned)."""
    return ["| " + " | ".join(head) + " |", "| --- | " + " | ".join("---:" for _ in head[1:]) + " |",
            *("| " + " | ".join(row) + " |" for row in rows)]


def paper_markdown(paper: dict[str, Any]) -> str:
    """Table 4's shape (themes × difficulty: completion, process, knowledge) and Table 5's
    (unit tests: completion, process). Knowledge columns only when some game was judged."""
    lines: list[str] = []
    theme_cells = [c for t in paper["themes"].values() for c in t.values()]
    judged = any(c["knowledge"] is not None for c in theme_cells)
    metrics = METRICS if judged else METRICS[:2]
    short = {"completion": "Compl.", "process": "Process", "knowledge": "Knowl."}
    diffs = list(paper["theme_average"])
    if diffs:
        lines += ["Discovery themes (the paper's Table 4): completion, process score"
                  + (" and knowledge" if judged else "") + " per difficulty, averaged over the seeds played"
                  + ("" if judged else " (knowledge needs --judge)"), ""]
        rows = [*paper["themes"].items(), ("**Average**", paper["theme_average"])]
        lines += _table(["theme", *(f"{d} {short[m]}" for d in diffs for m in metrics), "games"],
                        [[name, *(_f(cells[d][m]) if d in cells else "" for d in diffs for m in metrics),
                          str(sum(c["games"] for c in cells.values()))] for name, cells in rows]) + [""]
    if paper["unit_tests"] or paper["tutorial"]:
        lines += ["Unit tests (the paper's Table 5): completion and process score, averaged over the seeds "
                  "played", ""]
        rows = dict(paper["unit_tests"])
        if paper["unit_test_average"]:
            rows["**Average**"] = paper["unit_test_average"]
        if paper["tutorial"]:
            rows["Tutorial (not in the paper)"] = paper["tutorial"]
        lines += _table(["unit test", "Compl.", "Process", "games"], [
            [n, _f(c["completion"]), _f(c["process"]), str(c["games"])] for n, c in rows.items()]) + [""]
    return "\n".join(lines)


def compare_paper(named: list[tuple[str, dict[str, Any]]]) -> str:
    """DiscoveryWorld results side by side: one row per (scenario, difficulty), one column per
    result, each cell `completion / process / knowledge`."""
    themes = [(t, d) for _, paper in named for t, cells in paper["themes"].items() for d in cells]
    keys = list(dict.fromkeys(themes + [(u, "") for _, paper in named for u in paper["unit_tests"]]))
    if not keys:
        return ""
    def values(c: dict[str, Any] | None) -> str:
        return " / ".join(_f(c[m]) for m in METRICS) if c else ""

    rows = [[f"{t} {d}".rstrip(), *(values(p["themes"].get(t, {}).get(d) if d else p["unit_tests"].get(t))
                                    for _, p in named)] for t, d in keys]
    rows += [[f"**Average {d}**", *(values(p["theme_average"].get(d)) for _, p in named)]
             for d in DIFFICULTIES if any(d in p["theme_average"] for _, p in named)]
    lines = ["DiscoveryWorld, completion / process / knowledge per scenario (– = not measured):", "",
             *_table(["scenario", *(n for n, _ in named)], rows)]
    return "\n".join(lines) + "\n"
