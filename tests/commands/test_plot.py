"""The plot of a hand-made metrics.jsonl: which lines, how they differ, integer ticks, eval points, the PNG."""

from __future__ import annotations

import json
import math
import os

import pytest

from sailrl.cli import main
from sailrl.plot import build_figure, plot_run


def metrics_lines() -> list[dict]:
    lines = []
    for step in range(5):
        m = {"step": step, "reward/total": 0.1 * step, "reward/correct": 0.1 * step, "reward/format": 0.0,
             "correct": 0.2 * step,
             "degenerate_frac": 0.5, "frac_truncated": 0.25 * (4 - step) / 4, "learning_rate": 1e-4}
        if step in (1, 4):
            m["eval/reward/total"] = 0.2 * step
        lines.append(m)
    lines[2]["reward/format"] = None  # NaN written as null
    return lines


def by_label(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


def test_reward_panel_has_every_line_each_with_its_own_style():
    fig = build_figure(metrics_lines(), title="demo")
    top, bottom = fig.axes
    lines = by_label(top)
    assert list(lines) == ["total", "correct (mean score)", "format (mean score)", "eval total"]
    # total and correct are identical here: style, marker and colour still tell them apart
    assert list(lines["total"].get_ydata()) == pytest.approx(list(lines["correct (mean score)"].get_ydata()))
    styles = {(str(ln.get_linestyle()), ln.get_marker(), ln.get_color()) for ln in lines.values()}
    assert len(styles) == 4
    # ... and the total is a wider band drawn under the rules, so a rule equal to it is not hidden
    assert lines["total"].get_zorder() < lines["correct (mean score)"].get_zorder()
    assert lines["total"].get_linewidth() > 2 * lines["correct (mean score)"].get_linewidth()
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["total", "correct (mean score)",
                                                                    "format (mean score)", "eval total"]
    # a null value is a gap, not a zero
    assert math.isnan(lines["format (mean score)"].get_ydata()[2])
    assert fig._suptitle.get_text() == "demo"


def test_eval_points_are_marked_at_their_steps():
    top = build_figure(metrics_lines()).axes[0]
    ev = by_label(top)["eval total"]
    assert list(ev.get_xdata()) == [1, 4] and list(ev.get_ydata()) == pytest.approx([0.2, 0.8])
    assert ev.get_marker() == "D" and ev.get_markersize() >= 8


def test_bottom_panel_draws_degenerate_and_truncated_fractions():
    bottom = build_figure(metrics_lines()).axes[1]
    lines = by_label(bottom)
    assert list(lines) == ["correct (pass rate)", "degenerate groups", "truncated"]
    # Issue 18.15: 'correct' is the pass rate, as the console prints it (not the rule's weighted contribution)
    assert list(lines["correct (pass rate)"].get_ydata()) == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8])
    assert list(lines["truncated"].get_ydata()) == pytest.approx([0.25, 0.1875, 0.125, 0.0625, 0.0])
    assert bottom.get_xlabel() == "step" and bottom.get_ylim() == (-0.05, 1.05)


def test_short_runs_get_integer_step_ticks():
    for n in (1, 2, 5):
        fig = build_figure(metrics_lines()[:n])
        ax = fig.axes[1]
        ticks = [t for t in ax.xaxis.get_major_locator()() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), (n, ticks)
    # the step field is used as is (no shift)
    assert list(by_label(build_figure(metrics_lines()).axes[0])["total"].get_xdata()) == [0, 1, 2, 3, 4]


def test_long_runs_thin_out_markers():
    many = [{"step": s, "reward/total": s / 300} for s in range(300)]
    assert by_label(build_figure(many).axes[0])["total"].get_markevery() == 10


def test_lines_without_values_and_lines_without_steps_are_left_out():
    fig = build_figure([{"step": 0, "reward/total": 1.0, "reward/x": None}, {"note": "no step"}])
    assert list(by_label(fig.axes[0])) == ["total"]
    with pytest.raises(ValueError, match="no steps"):
        build_figure([{"step": "0"}, {"step": True}])


def test_plot_run_writes_a_png_and_the_command_reports_errors(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics_lines()), encoding="utf-8")
    out = tmp_path / "plots" / "r.png"
    plot_run(run, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", str(run), "-o", str(tmp_path / "c.png")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'c.png'}\n"
    (run / "metrics.jsonl").write_text("", encoding="utf-8")
    assert main(["plot", str(run)]) == 1
    assert capsys.readouterr().err == f"error: {run}/metrics.jsonl has no steps yet\n"


def test_plot_writes_only_a_png_path_and_replaces_only_a_png(tmp_path, capsys):
    """-o must end in .png (matplotlib would write runs.png for `-o runs` and the command say "wrote runs"); an
    existing file that is not a PNG (the data, a spec), a folder, a pipe or a link is refused and left as it was."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics_lines()), encoding="utf-8")
    assert main(["plot", str(run), "-o", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == (f"sailrl plot: error: -o {tmp_path / 'runs'}: the plot is a PNG: name a file "
                                       "ending in .png\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    data = tmp_path / "rows.png"
    data.write_text('{"question": "1+1"}\n', encoding="utf-8")
    assert main(["plot", str(run), "-o", str(data)]) == 1
    assert capsys.readouterr().err == (f"error: {data} exists and is not a PNG: sailrl plot replaces only an earlier "
                                       "plot; name another file\n")
    assert data.read_text(encoding="utf-8") == '{"question": "1+1"}\n'
    folder, pipe, link = tmp_path / "d.png", tmp_path / "f.png", tmp_path / "l.png"
    folder.mkdir()
    os.mkfifo(pipe)
    link.symlink_to(data)
    for path, why in ((folder, "exists and is not a file: name a PNG file to write"),
                      (pipe, "exists and is not a file: name a PNG file to write"),
                      (link, "is a symbolic link: name the PNG file itself")):
        assert main(["plot", str(run), "-o", str(path)]) == 1
        assert capsys.readouterr().err == f"error: {path} {why}\n"
    assert data.read_text(encoding="utf-8") == '{"question": "1+1"}\n'
    earlier = tmp_path / "earlier.png"
    assert main(["plot", str(run), "-o", str(earlier)]) == 0
    first = earlier.read_bytes()
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", str(run), "-o", str(earlier)]) == 0  # an earlier plot is replaced
    assert capsys.readouterr().out == f"wrote {earlier}\nwrote {earlier}\n"
    assert earlier.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
